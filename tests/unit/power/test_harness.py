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
