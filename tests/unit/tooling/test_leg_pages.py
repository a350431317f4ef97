"""The reusable workflow's verdict job names each failing leg and shows its page (tooling/ci/leg_pages.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT
from tooling.ci.gate_plan import plan

MATRIX = plan("dispatch,kernels,e2e", "0.32.0", "0.33.0", "random")["gpu-matrix"]


def _leg(legs: Path, leg: str, outcome: str, page: str | None) -> None:
    """What a tier job leaves in its artifact: its reports and the mark its last step writes (a real process)."""
    reports = legs / f"moegate-{leg}-attempt1" / "reports"
    reports.mkdir(parents=True)
    if page:
        (reports / "gate.md").write_text(page)
        (reports / "other.md").write_text("not the page")
    subprocess.run([sys.executable, "-m", "tooling.ci.leg_pages", "mark", "--leg", leg, "--outcome", outcome,
                    "--reports", str(reports)], cwd=ROOT, check=True, capture_output=True)  # fmt: skip


def _verdict(legs: Path, tmp_path: Path, plan_result: str = "success") -> tuple[str, str]:
    summary = tmp_path / "summary.md"
    proc = subprocess.run(
        [sys.executable, "-m", "tooling.ci.leg_pages", "verdict", "--dir", str(legs), "--attempt", "1",
         "--run-url", "https://github.com/o/r/actions/runs/9", "--plan", plan_result, "--dispatch", "true",
         "--meta", "false", "--gpu-matrix", MATRIX],
        cwd=ROOT, capture_output=True, text=True, check=True, env={**os.environ, "GITHUB_STEP_SUMMARY": str(summary)},
    )  # fmt: skip
    return proc.stdout, summary.read_text()


def test_each_failing_leg_is_named_with_its_page_and_a_lost_leg_too(tmp_path):
    legs = tmp_path / "legs"
    _leg(legs, "dispatch", "success", "# dispatch: PASS\n")
    _leg(legs, "kernels-pr", "failure", "# moegate gate: FAIL\n\nmoegate repro kernels --case ...\n")
    out, summary = _verdict(legs, tmp_path)
    assert "::error::gpu kernels-pr: failure; page: reports/gate.md in moegate-kernels-pr-attempt1" in out
    assert "::error::gpu e2e-random-base-vs-pr: no report (its job never reached its upload)" in out
    assert "dispatch" not in out.replace("::error::", "").split("Failing legs")[0]
    assert summary.startswith("### Failing legs: kernels-pr, e2e-random-base-vs-pr\n")
    assert "[the run's artifacts](https://github.com/o/r/actions/runs/9#artifacts)" in summary
    assert "moegate repro kernels --case ..." in summary and "not the page" not in summary


def test_a_run_whose_legs_all_succeeded_says_so(tmp_path):
    legs = tmp_path / "legs"
    for leg in ("dispatch", "kernels-pr", "e2e-random-base-vs-pr"):
        _leg(legs, leg, "success", None)
    out, summary = _verdict(legs, tmp_path)
    assert "::error::" not in out
    assert summary == "### Every leg succeeded (dispatch, kernels-pr, e2e-random-base-vs-pr)\n"
    assert json.loads((legs / "moegate-dispatch-attempt1" / "reports" / "leg.json").read_text())["page"] is None


def test_a_failed_plan_says_no_leg_ran(tmp_path):
    out, summary = _verdict(tmp_path / "none", tmp_path, plan_result="failure")
    assert "::error::plan: failure: no leg ran" in out and summary.startswith("### The plan did not succeed (failure)")


def test_the_example_lines_reach_the_summary_in_moegates_own_runs_only(tmp_path):
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "dispatch.log").write_text("FAIL\npin it: @example(case=MoECase.from_dict({}))\n")
    (tmp_path / "reports" / "gate.md").write_text("# moegate gate: FAIL\n")

    def summary(**env: str) -> str:
        out = tmp_path / f"summary-{len(env)}.md"
        subprocess.run([str(ROOT / ".ci" / "report")], cwd=tmp_path, check=True,
                       env={"PATH": os.environ["PATH"], "GITHUB_STEP_SUMMARY": str(out), **env})  # fmt: skip
        return out.read_text()

    assert summary() == "# moegate gate: FAIL\n\n"  # a vLLM repository's run: the page, no @example
    assert "@example(case=MoECase.from_dict({}))" in summary(MOEGATE_EXAMPLES="true")
