"""The part of vLLM the reach report measures: read from a vLLM-shaped tree, refused when a module is missing."""

from __future__ import annotations

import pytest

from moegate.reach import layout
from tests.support.reach import fake_vllm


def test_the_layout_lists_the_package_the_called_helpers_and_the_triton_kernels(tmp_path):
    lay = layout.read(fake_vllm(tmp_path))
    assert lay.version == "9.9.9"
    assert f"{layout.PACKAGE}/fused_moe.py" in lay.files and "_custom_ops.py" in lay.files
    # the package names called_by_the_package; that one names called_by_the_helper; nothing names never_named
    assert lay.helper_scopes["_custom_ops.py"] == {"called_by_the_package", "called_by_the_helper"}
    assert lay.measures("_custom_ops.py", "called_by_the_helper")
    assert not lay.measures("_custom_ops.py", "never_named") and not lay.measures("_custom_ops.py", layout.MODULE)
    assert lay.measures(f"{layout.PACKAGE}/fused_moe.py", "fused_experts_impl")
    assert lay.triton == {f"{layout.PACKAGE}/fused_moe.py::fused_moe_kernel"}


@pytest.mark.parametrize(
    "missing,named",
    [
        (f"{layout.PACKAGE}/experts/triton_moe.py", "vllm.model_executor.layers.fused_moe.experts.triton_moe"),
        ("model_executor/layers/quantization/utils/fp8_utils.py", "vllm.model_executor.layers.quantization.utils.fp8_utils"),
        (f"{layout.PACKAGE}/__init__.py", "vllm.model_executor.layers.fused_moe"),
    ],
)  # fmt: skip
def test_a_vllm_whose_layout_the_report_does_not_know_is_refused_naming_the_module(tmp_path, missing, named):
    with pytest.raises(layout.LayoutError) as err:
        layout.read(fake_vllm(tmp_path, drop=(missing,)))
    message = str(err.value)
    assert f"no module {named} " in message and "\n" not in message


def test_patterns_match_files_and_qualified_names():
    assert layout.matches("model_executor/*", "model_executor/layers/x.py", "f")
    assert layout.matches("a.py::T.*", "a.py", "T.apply") and not layout.matches("a.py::T.*", "a.py", "U.apply")
