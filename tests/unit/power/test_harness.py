"""The power harness's own guarantees, on small synthetic vLLM-shaped packages (no vLLM, no torch).

- the region finder picks exactly the named functions/lines, by structure, and
  fails with one error naming everything it looked for and did not find;
- a missing cosmic-ray is one line with the install command;
- mutant ids are stable when code above the function moves;
- the overlay copies (never links) the mutated files, so cosmic-ray's in-place
  writes cannot reach the installed package;
- the installed files are byte-identical after a run that is SIGKILLed or
  SIGINTed while a mutant is applied (needs cosmic-ray: skipped without it, with
  the reason; `nox -s power` runs these first, in the tool's environment);
- a run not on a terminal writes one progress line per stage, with the report's counts.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path

import pytest

from moegate.power import summary_line
from moegate.power.cli import main
from moegate.power.driver import require_tool
from moegate.power.errors import PowerError, TargetNotFound, ToolMissing
from moegate.power.outcome import Mutant, Outcome, load_equivalents, mutant_id
from moegate.power.regions import FUSED_MOE, find_regions
from moegate.power.report import render_markdown
from moegate.power.run import EQUIVALENTS_FILE
from tests.support.power import FUSED, TRITON, lines_of, sources

# --- region finder -------------------------------------------------------------------


def test_regions_cover_exactly_the_named_functions_and_lines() -> None:
    regions = find_regions(sources())
    got = {(r.spec.scope, r.spec.kind, r.first, r.last) for r in regions}
    body_whr = lines_of(FUSED, "return any(")
    decide = lines_of(FUSED, "naive = expert_map")
    ret = lines_of(FUSED, 'return "naive"')
    count_arg = lines_of(FUSED, "            global_num_experts,")
    flag_arg = lines_of(FUSED, "weights_host_resident=_weights_host_resident(w1, w2)")
    assign = lines_of(TRITON, "num_align_experts = len(w1)")
    call_line = lines_of(TRITON, "topk_ids, {}, len(topk_ids), 1, num_align_experts")
    flag_t = lines_of(TRITON, "weights_host_resident=_weights_host_resident(w1, w2)")
    assert got == {
        ("_weights_host_resident", "body", body_whr, body_whr),  # docstring excluded
        ("_prepare_expert_assignment", "body", decide, ret),
        ("fused_experts_impl", "call-args", count_arg, count_arg),  # positional: resolved by parameter name
        ("fused_experts_impl", "call-args", flag_arg, flag_arg),
        ("TritonExperts.apply", "assign", assign, assign),  # not TritonWNA16Experts.apply's
        ("TritonExperts.apply", "call-args", call_line, call_line),
        ("TritonExperts.apply", "call-args", flag_t, flag_t),
    }
    # the `if global_num_experts == -1` default and the helper are out of scope
    default_line = lines_of(FUSED, "if global_num_experts == -1")
    helper_line = lines_of(FUSED, "return 1")
    assert not any(r.contains(default_line) or r.contains(helper_line) for r in regions)


def test_keyword_expert_count_is_found_too() -> None:
    fused = FUSED.replace(
        "        global_num_experts,\n        None,\n",
        "        global_num_experts=global_num_experts,\n        expert_map=None,\n",
    )
    assert fused != FUSED
    regions = find_regions(sources(fused=fused))
    line = lines_of(fused, "global_num_experts=global_num_experts,")
    assert any(r.spec.scope == "fused_experts_impl" and r.first == line for r in regions)


def test_missing_functions_give_one_error_naming_each() -> None:
    fused = FUSED.replace("def _weights_host_resident", "def _renamed_residency").replace(
        "def _prepare_expert_assignment", "def _renamed_assignment"
    )
    with pytest.raises(TargetNotFound) as exc:
        find_regions(sources(fused=fused), where="vLLM 9.9.9")
    msg = str(exc.value)
    assert msg.startswith("vLLM 9.9.9 does not contain the dispatch code")
    assert "function _weights_host_resident in model_executor/layers/fused_moe/fused_moe.py" in msg
    assert "function _prepare_expert_assignment in" in msg
    assert "\n" not in msg  # one line


def test_missing_argument_and_method_are_named() -> None:
    triton = TRITON.replace("weights_host_resident=_weights_host_resident(w1, w2),", "").replace(
        "class TritonExperts:", "class TritonExpertsRenamed:"
    )
    with pytest.raises(TargetNotFound, match=r"function TritonExperts\.apply in .*triton_moe\.py"):
        find_regions(sources(triton=triton))
    triton = TRITON.replace("weights_host_resident=_weights_host_resident(w1, w2),", "")
    with pytest.raises(
        TargetNotFound,
        match="argument weights_host_resident in the call to _prepare_expert_assignment in TritonExperts.apply",
    ):
        find_regions(sources(triton=triton))


def test_missing_file_is_named() -> None:
    with pytest.raises(TargetNotFound, match="file model_executor/layers/fused_moe/experts/triton_moe.py"):
        find_regions({FUSED_MOE: FUSED})


def test_missing_tool_is_one_line_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cosmic_ray" else real(name, *a))
    with pytest.raises(ToolMissing) as exc:
        require_tool()
    assert "pip install 'cosmic-ray" in str(exc.value) and "\n" not in str(exc.value)
    previous = signal.getsignal(signal.SIGTERM)  # main() installs its own SIGTERM handler
    try:
        rc = main(["--vllm-python", sys.executable, "--package-dir", "/nonexistent"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert rc == 2


def test_mutant_ids_do_not_move_with_code_above_the_function() -> None:
    before = find_regions(sources())
    shifted = find_regions(sources(fused="# a new comment\n\n\n" + FUSED))
    for a, b in zip(before, shifted, strict=True):
        assert b.first == a.first + (3 if a.spec.file == FUSED_MOE else 0)
        assert mutant_id(a, "core/NumberReplacer", a.first, 4) == mutant_id(b, "core/NumberReplacer", b.first, 4)
    assert mutant_id(before[1], "core/ReplaceComparisonOperator_LtE_Lt", before[1].first, 9).startswith(
        "fused_moe:_prepare_expert_assignment:ReplaceComparisonOperator_LtE_Lt@+"
    )


# --- equivalents, plugin line, report --------------------------------------------------


def test_equivalent_entries_need_a_reason(tmp_path: Path) -> None:
    f = tmp_path / "eq.toml"
    f.write_text('[mutant."a:b:C@+1:2"]\nreason = "because"\n')
    assert load_equivalents(f) == {"a:b:C@+1:2": "because"}
    f.write_text('[mutant."a:b:C@+1:2"]\nreason = ""\n')
    with pytest.raises(PowerError, match="has no reason"):
        load_equivalents(f)


def test_the_committed_equivalents_file_parses() -> None:
    assert isinstance(load_equivalents(EQUIVALENTS_FILE), dict)


def test_an_equivalent_counts_only_in_the_group_it_was_reviewed_in(tmp_path: Path) -> None:
    f = tmp_path / "eq.toml"
    f.write_text('[mutant."a:b:C@+1:2"]\nreason = "r"\n[mutant."k:b:C@+1:2"]\nreason = "s"\ngroup = "kernel"\n')
    assert load_equivalents(f, ["dispatch"]) == {"a:b:C@+1:2": "r"}  # no group: dispatch, as before groups
    assert load_equivalents(f, ["kernel", "offload"]) == {"k:b:C@+1:2": "s"}
    assert len(load_equivalents(f)) == 2
    f.write_text('[mutant."a:b:C@+1:2"]\nreason = "r"\ngroup = "kernels"\n')
    with pytest.raises(PowerError, match="group 'kernels' is not one of dispatch, kernel, offload"):
        load_equivalents(f)


def test_plugin_line_is_read_back() -> None:
    out = "....F\n" + summary_line.MARK + ' {"first_failure_s": 1.5, "failing_test": "t"}\n1 failed\n'
    assert summary_line.read(out) == {"first_failure_s": 1.5, "failing_test": "t"}
    assert summary_line.read("no line") is None
    assert summary_line.read(None) is None


def test_report_shows_score_and_survivor_diff() -> None:
    ms = [
        Mutant("k", "1", "f", 10, "core/X", "r", status="killed", first_failure_s=2.0, failing_test="t1"),
        Mutant("s", "2", "f", 11, "core/Y", "r", status="survived", diff="-a\n+b"),
        Mutant("e", "3", "f", 12, "core/Z", "r", status="equivalent", reason="same for all inputs"),
    ]
    o = Outcome("9.9", "/p", "nox -s power", "pytest", [], ms, {"wall_s": 1}, 3.0, {}, True)
    assert o.score == 0.5 and not o.passed
    md = render_markdown(o)
    assert "FAIL: mutation score 50.0 %" in md
    assert "### `s` (survived)" in md and "-a\n+b" in md
    assert "- `e`: same for all inputs" in md
    assert "| `k` | 10 | 2.00 |" in md
    ms[1].status = "equivalent"
    assert Outcome("9.9", "/p", "", "", [], ms, {}, 1.0, {}, True).passed


# --- the kernel-path and offload groups ------------------------------------------------

KERNELISH = """
def fused_moe_kernel(a_ptr, b_ptr, c_ptr, b_bias_ptr, stride_bbe, stride_bbn, HAS_BIAS=False):
    pass


def invoke_fused_moe_triton_kernel(A, B, C, B_bias=None):
    HAS_BIAS = B_bias is not None
    fused_moe_kernel[(1,)](
        A,
        B,
        C,
        B_bias,
        B_bias.stride(0) if B_bias is not None else 0,
        B_bias.stride(1) if B_bias is not None else 0,
        HAS_BIAS=HAS_BIAS,
    )


class TritonExperts:
    def apply(self, w1, activation, N):
        cache2_dim = N // 2
        def _base_w13_fn():
            invoke_fused_moe_triton_kernel(1, w1, 3,
                B_bias=self.w1_bias)
        _base_w13_fn()
        if activation == "silu" and self.clamp is None:
            q = ops.silu_and_mul_per_block_quant(1, group_size=128)
        else:
            self.activation(activation, 2, 3)
        return cache2_dim
"""


def test_call_kinds_find_subscripted_kernels_nested_closures_and_the_if_around_a_call() -> None:
    from moegate.power.regions import RegionSpec

    f = "x/kernelish.py"
    specs = (
        RegionSpec(f, "invoke_fused_moe_triton_kernel", "assign", "b", name="HAS_BIAS"),
        RegionSpec(f, "invoke_fused_moe_triton_kernel", "call-args", "b", name="fused_moe_kernel",
                   params=("b_bias_ptr", "stride_bbe", "stride_bbn")),
        RegionSpec(f, "TritonExperts.apply", "call-args", "b", name="invoke_fused_moe_triton_kernel",
                   params=("B_bias",), nested=True),
        RegionSpec(f, "TritonExperts.apply", "if-test", "a", name="silu_and_mul_per_block_quant"),
        RegionSpec(f, "TritonExperts.apply", "call", "a", name="activation"),
    )  # fmt: skip
    regions = find_regions({f: KERNELISH}, specs)
    got = sorted((r.spec.kind, r.first, r.last) for r in regions)
    assert got == sorted(
        [
            ("assign", lines_of(KERNELISH, "HAS_BIAS = B_bias"), lines_of(KERNELISH, "HAS_BIAS = B_bias")),
            ("call-args", lines_of(KERNELISH, "        B_bias,"), lines_of(KERNELISH, "        B_bias,")),
            ("call-args", lines_of(KERNELISH, "B_bias.stride(0)"), lines_of(KERNELISH, "B_bias.stride(0)")),
            ("call-args", lines_of(KERNELISH, "B_bias.stride(1)"), lines_of(KERNELISH, "B_bias.stride(1)")),
            ("call-args", lines_of(KERNELISH, "B_bias=self.w1_bias"), lines_of(KERNELISH, "B_bias=self.w1_bias")),
            ("if-test", lines_of(KERNELISH, 'if activation == "silu"'), lines_of(KERNELISH, 'if activation == "silu"')),
            ("call", lines_of(KERNELISH, "self.activation("), lines_of(KERNELISH, "self.activation(")),
        ]
    )
    closed = RegionSpec(f, "TritonExperts.apply", "call-args", "b", name="invoke_fused_moe_triton_kernel",
                        params=("B_bias",))  # fmt: skip
    with pytest.raises(TargetNotFound, match="a call to invoke_fused_moe_triton_kernel in TritonExperts.apply"):
        find_regions({f: KERNELISH}, (closed,))  # without nested=True the closure is another scope


def test_every_group_is_found_in_the_installed_vllm_when_there_is_one() -> None:
    """The real sources, read as text: each group's regions exist in this release (skipped without vLLM)."""
    from moegate.power.regions import GROUPS

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no vllm package here to read")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, specs in GROUPS.items():
        files = {s.file: (root / s.file).read_text() for s in specs}
        regions = find_regions(files, specs)
        assert {r.spec for r in regions} == set(specs), name


def test_an_unknown_region_group_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--vllm-python", sys.executable, "--regions", "dispatch,kernels"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "moegate power: --regions dispatch,kernels: unknown region group(s) ['kernels']; known: dispatch, kernel, offload"
    ]


@pytest.mark.parametrize("shard", ["3/3", "1", "a/2", "-1/2"])
def test_a_bad_shard_is_one_line(capsys: pytest.CaptureFixture[str], shard: str) -> None:
    assert main(["--vllm-python", sys.executable, f"--shard={shard}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"moegate power: --shard {shard}: expected K/N with 0 <= K < N, e.g. 0/3"
    ]


def test_a_mutant_is_unreached_only_when_no_line_of_its_statement_ran(tmp_path: Path) -> None:
    from moegate.power.run import mark_unreached

    source = "def f(x):\n    if (x and\n            x > 1):\n        return 1\n    return 2\n"
    copy = tmp_path / "m.py"
    copy.write_text(source)
    mutants = [Mutant(f"m{i}", f"j{i}", "m.py", line, "Op", "r") for i, line in enumerate((3, 4, 5))]
    out = mark_unreached(mutants, {"m.py": copy}, {str(copy): {2, 5}})  # the if's first line and the last return ran
    assert [m.id for m in out] == ["m1"]  # line 3 belongs to the if that ran; line 4's return never ran
    assert mutants[1].status == "unreached" and "never execute line 4" in mutants[1].reason
    assert mutants[0].status == mutants[2].status == "pending"


def test_the_reach_plugin_records_the_lines_a_traced_file_executes(tmp_path: Path) -> None:
    import json
    import os
    import subprocess

    from moegate.power import reach

    mod = tmp_path / "traced_mod.py"
    mod.write_text("def f(x):\n    if x:\n        return 1\n    return 2\n")
    test = tmp_path / "test_t.py"
    test.write_text("import traced_mod\n\ndef test_f():\n    assert traced_mod.f(True) == 1\n")
    env = {
        **os.environ,
        reach.ENV: json.dumps([str(mod)]),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path.cwd())]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "moegate.power.reach", "-p", "no:cacheprovider", str(test)],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = reach.read(proc.stdout)
    assert lines is not None and {2, 3} <= lines[str(mod)] and 4 not in lines[str(mod)]


def test_shards_split_the_mutants_without_overlap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moegate.power import driver

    monkeypatch.setattr(driver, "mark_skipped", lambda db, ids: None)
    mutants = [Mutant(f"m{i}", f"j{i}", "f.py", i, "Op", "r") for i in range(7)]
    parts = [driver.keep_only(tmp_path / "db", mutants, (), None, (k, 3)) for k in range(3)]
    assert [[m.id for m in p] for p in parts] == [["m0", "m3", "m6"], ["m1", "m4"], ["m2", "m5"]]
