"""coverage.py's report cut down to the measured functions' branches, and several runs joined."""

from __future__ import annotations

import pytest

from moegate.reach import branches, layout
from tests.support.reach import coverage_report, fake_vllm, fn

FM = f"{layout.PACKAGE}/fused_moe.py"


def test_the_reduction_keeps_measured_functions_with_their_arcs_and_the_lines_they_leave(tmp_path):
    root = fake_vllm(tmp_path)
    lay = layout.read(root)
    report = coverage_report(
        root,
        {
            FM: {
                "fused_moe_kernel": fn([], [6], [], []),  # a Triton kernel: compiled, never run by Python
                "fused_experts_impl": fn([10, 11, 12, 14], [13], [[10, 11], [12, 14]], [[10, 12], [12, 13]]),
                "": fn([1, 4], [], [], []),
            },
            "_custom_ops.py": {"called_by_the_helper": fn([6], [7, 8], [], [[6, 7], [6, 8]]), "never_named": fn([], [12], [], [])},
            "elsewhere.py": {"f": fn([1], [], [], [])},
        },
    )  # fmt: skip
    functions, triton = branches.reduce(report, lay)
    assert set(functions) == {f"{FM}::fused_experts_impl", f"{FM}::<module>", "_custom_ops.py::called_by_the_helper"}
    impl = functions[f"{FM}::fused_experts_impl"]
    assert impl["arcs"] == [[10, 11, 1], [10, 12, 0], [12, 13, 0], [12, 14, 1]]
    assert impl["text"] == {"10": "if expert_map is not None:", "12": "if is_rocm():"}
    assert impl["executed"] == [10, 11, 12, 14] and impl["statements"] == 5
    assert triton == [f"{FM}::fused_moe_kernel"]


def test_a_report_without_branch_data_is_refused(tmp_path):
    lay = layout.read(fake_vllm(tmp_path))
    with pytest.raises(branches.CoverageFormatError, match="no branch data"):
        branches.reduce({"meta": {"branch_coverage": False}, "files": {}}, lay)


def test_runs_join_a_line_or_branch_any_of_them_took():
    a = {"f::g": {"executed": [1, 2], "statements": 4, "arcs": [[1, 2, 1], [1, 3, 0]], "text": {"1": "if x:"}}}
    b = {"f::g": {"executed": [1, 3], "statements": 4, "arcs": [[1, 2, 0], [1, 3, 1]], "text": {"1": "if x:"}},
         "f::h": {"executed": [], "statements": 1, "arcs": [], "text": {}}}  # fmt: skip
    joined = branches.merge([a, b])
    assert joined["f::g"]["arcs"] == [[1, 2, 1], [1, 3, 1]] and joined["f::g"]["executed"] == [1, 2, 3]
    assert not branches.reached(joined["f::h"]) and branches.reached(joined["f::g"])
    assert a["f::g"]["arcs"] == [[1, 2, 1], [1, 3, 0]]  # the inputs are left as they were
