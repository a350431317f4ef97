"""The replay's job list, checked against the workflows so that no hosted job is left out.

A hosted job is one that runs on GitHub's machines: it has steps and no `self-hosted`
label (moegate.yml's `gpu` legs run on the GPU pool and are not replayed). A job that
calls a workflow (`uses:`) has no runner of its own; the called workflow's jobs are the
ones replayed. Each hosted job is replayed on an event it runs on: moegate.yml's jobs
through gate.yml's `moegate` job on `pull_request` (the inputs a pull request gives them),
`power` on `workflow_dispatch` (it runs nightly and on dispatch only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CALLER = "gate.yml"  # every replay starts here: act runs gate.yml and the moegate.yml it calls
CALLING_JOB = "moegate"  # gate.yml's job that calls moegate.yml
FINAL_JOB = "gate"  # gate.yml's required check, which needs every other job


@dataclass(frozen=True)
class Run:
    """One act invocation: `act EVENT -W .github/workflows/gate.yml [-j TARGET]`; no target: the event's whole graph."""

    event: str
    target: str | None
    jobs: tuple[str, ...]  # "workflow:job", every hosted job this invocation replays


RUNS = (
    Run(
        "pull_request",
        None,
        (
            "gate.yml:lint",
            "gate.yml:unit",
            "gate.yml:e2e-smoke",
            "moegate.yml:plan",
            "moegate.yml:dispatch",
            "moegate.yml:meta",
            "moegate.yml:verdict",
            "gate.yml:gate",
        ),
    ),
    Run("workflow_dispatch", "power", ("gate.yml:power",)),
)


NOT_REPLAYED = {
    "vllm-main.yml:fit": "installs vLLM main's nightly wheel from wheels.vllm.ai, which this machine cannot reach; "
    "its parts run in the unit tier (tests/unit/tooling/test_vllm_main.py, tests/unit/census/test_fit.py) and the fit "
    "probe in the dispatch tier (tests/dispatch/test_fit.py)",
    "vllm-main.yml:report": "needs fit's outputs; its three outcomes are the fit's and the gate's, each shown above",
}
"""Hosted jobs the replay cannot run on this machine, each with why and where its parts are shown instead."""


def _labels(job: Mapping[str, Any]) -> set[str]:
    runs_on = job.get("runs-on", [])
    if isinstance(runs_on, dict):
        runs_on = runs_on.get("labels", [])
    return {runs_on} if isinstance(runs_on, str) else set(runs_on)


def hosted_jobs(workflows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """`workflow:job` of every job with steps that runs on GitHub's machines, in file order."""
    return [
        f"{name}:{job_name}"
        for name, data in workflows.items()
        for job_name, job in (data.get("jobs") or {}).items()
        if "steps" in job and "self-hosted" not in _labels(job)
    ]


def replayed(runs: tuple[Run, ...] = RUNS) -> list[str]:
    return [job for run in runs for job in run.jobs]


def unreplayed(workflows: Mapping[str, Mapping[str, Any]], runs: tuple[Run, ...] = RUNS) -> list[str]:
    """Problems, one line each: a hosted job the replay leaves out, or a replayed job that is no hosted job."""
    hosted, listed = hosted_jobs(workflows), replayed(runs)
    problems = [f"{job}: a hosted job the replay does not run (add it to tooling/ci_replay/jobs.py RUNS)"
                for job in hosted if job not in listed and job not in NOT_REPLAYED]  # fmt: skip
    problems += [
        f"{job}: in NOT_REPLAYED, but not a hosted job of the workflows" for job in NOT_REPLAYED if job not in hosted
    ]
    problems += [f"{job}: replayed, but not a hosted job of the workflows" for job in listed if job not in hosted]
    problems += [f"{job}: replayed twice" for i, job in enumerate(listed) if job in listed[:i]]
    return problems


def run_for(job: str, runs: tuple[Run, ...] = RUNS) -> Run:
    """The invocation that replays `job` ("workflow:job" or a bare job id) with as little else as act allows.

    act runs a job's needs with it: moegate.yml's jobs come as gate.yml's `moegate` job (plan,
    dispatch, meta and verdict together), and the final `gate` needs every job, so its replay
    is the event's whole graph.
    """
    for run in runs:
        for listed in run.jobs:
            if job not in (listed, listed.partition(":")[2]):
                continue
            workflow, _, job_id = listed.partition(":")
            if workflow != CALLER:
                return Run(run.event, CALLING_JOB, tuple(j for j in run.jobs if not j.startswith(f"{CALLER}:")))
            if job_id == FINAL_JOB:
                return run
            return Run(run.event, job_id, (listed,))
    raise KeyError(f"{job!r} is not a replayed job; known: {', '.join(replayed(runs))}")
