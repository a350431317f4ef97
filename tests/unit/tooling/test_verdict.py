"""The verdict as it runs (``python -m tooling.ci.verdict``): a real process, a real git repository standing for vLLM,
and the GitHub API played by ``tooling/ci_replay/fake_github.py`` over that repository.

Every case of issue 44's done-when list (``tooling/ci_replay/verdict_cases.py``: the pull request edits its caller,
equivalent without its label or with an earlier SHA's, a docs-only pull request, a policy nobody can read, a label
without its SHA) posts the status it must and exits as it must. The same cases run through act in the replay
(``python -m tooling.ci_replay.verdict_replay``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytest.importorskip("yaml", reason="PyYAML is not installed here (the unit env has it: nox -s unit)")

from tooling.ci_replay import verdict_cases as vc
from tooling.ci_replay.fake_github import Scenario, Server


@pytest.fixture(scope="module")
def vllm(tmp_path_factory) -> tuple[Path, vc.Heads]:
    repo = tmp_path_factory.mktemp("verdict") / "vllm"
    return repo, vc.make_repo(repo)


def _verdict(scenario: Scenario, event: dict, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))
    summary = tmp_path / "summary.md"
    with Server(scenario) as url:
        return subprocess.run(
            [sys.executable, "-m", "tooling.ci.verdict", "--event", str(path)],
            cwd=ROOT, capture_output=True, text=True, check=False,
            env={**os.environ, "GITHUB_API_URL": url, "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_SERVER_URL":
                 "https://github.com", "GITHUB_REPOSITORY": vc.REPO, "GITHUB_RUN_ID": "77", **env},
        )  # fmt: skip


@pytest.mark.parametrize("case", vc.CASES, ids=lambda c: c.name)
def test_each_done_when_case_gets_its_status_and_line(case, vllm, tmp_path):
    repo, heads = vllm
    head = heads[case.name][-1]
    concluded = {"wheels": vc.wheels_conclusion(repo, case, head)} if case.wheels else {}
    assert concluded.get("wheels") == case.wheels  # the wheels job ends as the case says (the replay: through act)
    scenario = vc.scenario(repo, case, heads[case.name], vc.changes_outputs(repo, case, head), concluded)
    event = vc.workflow_run_event(repo, case, head, "failure" if "failure" in concluded.values() else "success")
    proc = _verdict(scenario, event, tmp_path)
    said = proc.stdout + proc.stderr
    assert proc.returncode == case.want_exit, said
    assert [(s["sha"], s["state"], s["context"]) for s in scenario.statuses] == [(head, case.want_state, "moegate")]
    assert case.want_line in said, said
    assert scenario.statuses[0]["target_url"] == "https://github.com/vllm-project/vllm/actions/runs/77"
    if case.want_state == "error":  # one line, the same in the status
        assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1
        assert scenario.statuses[0]["description"] == proc.stderr.strip()[:140]
    else:
        assert (
            (tmp_path / "summary.md")
            .read_text()
            .startswith(f"## moegate verdict: {'PASS' if case.want_exit == 0 else 'FAIL'}: ")
        )


def test_the_verdict_reads_the_pull_request_only_through_the_api(vllm, tmp_path):
    """Nothing of the pull request is checked out or run: the calls it makes are reads, and one status."""
    repo, heads = vllm
    case = next(c for c in vc.CASES if c.name == "caller-impostor-job")
    head = heads[case.name][-1]
    scenario = vc.scenario(repo, case, heads[case.name], vc.changes_outputs(repo, case, head))
    _verdict(scenario, vc.workflow_run_event(repo, case, head), tmp_path)
    posts = [c for c in scenario.calls if not c.startswith("GET ")]
    assert posts == [f"POST /repos/{vc.REPO}/statuses/{head}"]
    assert f"GET /repos/{vc.REPO}/contents/.github/moegate-policy.yml" in scenario.calls


def test_a_run_that_ran_no_job_posts_nothing(vllm, tmp_path):
    """A label that is not the gate's own makes a run whose every job is skipped: the head's last verdict stands."""
    repo, heads = vllm
    case = vc.CASES[0]
    head = heads[case.name][-1]
    scenario = vc.scenario(repo, case, heads[case.name], vc.changes_outputs(repo, case, head))
    for job in scenario.jobs:
        job["conclusion"] = "skipped"
    proc = _verdict(scenario, vc.workflow_run_event(repo, case, head), tmp_path)
    assert proc.returncode == 0 and scenario.statuses == []
    assert "ran no job (a label that is not the gate's own): nothing posted" in proc.stdout


def test_a_merge_queue_run_finds_its_pull_request_by_the_queue_branch(vllm, tmp_path):
    repo, heads = vllm
    case = next(c for c in vc.CASES if c.name == "equivalent-label-at-head")
    head = heads[case.name][-1]
    scenario = vc.scenario(repo, case, heads[case.name], vc.changes_outputs(repo, case, head))
    event = vc.workflow_run_event(repo, case, head)
    event["workflow_run"].update(
        event="merge_group", head_branch=f"gh-readonly-queue/main/pr-7-{head}", pull_requests=[]
    )
    proc = _verdict(scenario, event, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert scenario.statuses[-1]["state"] == "success"


def test_the_status_goes_out_with_the_verdict_apps_token_where_one_is_given(vllm, tmp_path):
    """Reads with the workflow's token, the status with the app's: the required check can then take the app's only."""
    repo, heads = vllm
    case = vc.CASES[0]
    head = heads[case.name][-1]
    scenario = vc.scenario(repo, case, heads[case.name], vc.changes_outputs(repo, case, head))
    env = {"GITHUB_TOKEN": "workflow-token", "MOEGATE_STATUS_TOKEN": "app-token"}
    assert _verdict(scenario, vc.workflow_run_event(repo, case, head), tmp_path, **env).returncode == 0
    by_call = list(zip(scenario.calls, scenario.tokens, strict=True))
    assert [t for c, t in by_call if c.startswith("POST ")] == ["app-token"]
    assert {t for c, t in by_call if c.startswith("GET ")} == {"workflow-token"}


def test_the_label_is_read_only_where_an_e2e_leg_promised_equivalent(vllm, tmp_path):
    """A label without its SHA stops the verdict only where equivalent was promised; else it is not read at all."""
    repo, heads = vllm
    case = next(c for c in vc.CASES if c.name == "label-without-sha")
    head = heads[case.name][-1]
    outputs = {**vc.changes_outputs(repo, case, head), "promise": "identical"}
    scenario = vc.scenario(repo, case, heads[case.name], outputs)
    proc = _verdict(scenario, vc.workflow_run_event(repo, case, head), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert scenario.statuses[-1]["state"] == "success"
    assert not [c for c in scenario.calls if "/events" in c or "/permission" in c]
