"""The offload-truth plan asks for what it means to, judges outcomes against expectations, and renders its page; bad input is one line.

No GPU here: the runs themselves are ``moegate offload-truth``. These check the plan's table (every
checkpoint a scheme ``moegate.model.quantize`` writes, every planted bug a spec the builds accept, a planted
bug expected to FAIL by the rule it breaks), the budgets it hands the engine, the expectation check, and the
page rendered from a result document shaped like the engine's.
"""

from __future__ import annotations

import pytest

from moegate.builds.planted import parse_bug
from moegate.model.quantize import SCHEMES
from moegate.model.tiny_spec import TinyMoESpec
from moegate.offload.plan import RUNS, Run, budget_gb, main, met
from moegate.offload.report import render

SPEC = TinyMoESpec()


def test_every_run_uses_a_known_checkpoint_backend_and_bug_and_names_are_unique():
    assert len({r.name for r in RUNS}) == len(RUNS)
    for r in RUNS:
        assert r.checkpoint == "bf16" or r.checkpoint in SCHEMES, r
        assert r.moe_backend in ("triton", "marlin") and r.expect in ("PASS", "FAIL", "measure")
        if r.bug is not None:
            assert parse_bug(r.bug)["kind"] == "uva" and r.expect == "FAIL" and r.rules, r
        else:
            assert not r.rules and r.expect != "FAIL", r


def test_the_plan_covers_the_unquantized_layer_every_scheme_and_both_planted_offload_bugs():
    clean_pass = {r.checkpoint for r in RUNS if r.expect == "PASS" and r.budget == "ample"}
    assert clean_pass == {"bf16", *SCHEMES}
    assert {r.bug for r in RUNS if r.bug} == {"uva=noop", "uva=back"}
    assert {r.checkpoint for r in RUNS if r.bug == "uva=back"} >= {"bf16", "fp8-block"}


def test_budgets_are_every_expert_weight_none_or_exactly_one_bf16_w13():
    by = {r.budget: r for r in RUNS}
    assert budget_gb(by["ample"], SPEC) * (1 << 30) > 10 * SPEC.expert_bytes
    assert budget_gb(by["none"], SPEC) == 0.0
    assert int(budget_gb(by["one-w13"], SPEC) * 1024**3) == SPEC.w13_bytes == 128 * 256 * 256 * 2


def _result(run: Run, verdict: str | None, rules: tuple[str, ...] = ()) -> dict:
    findings = [{"rule": rule, "param": "p", "layer": 0, "message": f"layer 0 p: {rule}"} for rule in rules]
    return {"run": vars(run), "verdict": verdict, "findings": findings}


@pytest.mark.parametrize(
    "expect, rules, verdict, found, want",
    [
        ("PASS", (), "PASS", (), True),
        ("PASS", (), "FAIL", ("budget",), False),
        ("PASS", (), None, (), False),  # the engine did not complete
        ("FAIL", ("marked-not-host",), "FAIL", ("marked-not-host", "budget"), True),
        ("FAIL", ("marked-not-host",), "FAIL", ("budget",), False),  # failed, but not by the rule the bug breaks
        ("FAIL", ("budget",), "PASS", (), False),
        ("measure", (), "FAIL", ("marked-not-host",), True),
        ("measure", (), None, (), False),
    ],
)
def test_an_outcome_meets_its_expectation_only_by_the_right_verdict_and_rule(expect, rules, verdict, found, want):
    run = Run("r", "bf16", "triton", "ample", expect, "why", bug="uva=back" if expect == "FAIL" else None, rules=rules)
    assert met(run, _result(run, verdict, found)) is want


def test_the_page_has_a_row_per_run_the_gated_count_and_each_findings_line():
    results = []
    for run in RUNS[:3]:
        r = _result(run, "PASS")
        r.update(met=True, vllm="0.33.0", device="NVIDIA H200", figures={"host_bytes": 1 << 20, "pinned": {}})
        results.append(r)
    bad = _result(RUNS[-1], "PASS")
    bad.update(met=False, figures={})
    results.append(bad)
    crashed = {"run": vars(RUNS[6]), "verdict": None, "met": False, "error": "exit code 1", "log_tail": "Traceback"}
    results.append(crashed)
    page = render({"command": "python -m moegate offload-truth --out X", "results": results, "spec": vars(SPEC)})
    assert page.startswith("# Offload truth: vLLM 0.33.0 on NVIDIA H200")
    assert "**FAIL: 3 of 4 runs as expected**" in page and "1 measured without an expectation" in page
    assert page.count("\n| `") == len(results)
    assert "| **NO** |" in page and "did not complete (exit code 1)" in page and "Traceback" in page


def test_an_unknown_run_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--python", "python3", "--out", str(tmp_path / "out"), "--only", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moegate.offload.plan: unknown run(s) ['nope']")
    assert not (tmp_path / "out").exists()
