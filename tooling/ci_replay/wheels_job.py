"""The caller's ``wheels`` job through act for the verdict replay's compiled-source cases (``Case.wheels``):
``act pull_request -j wheels`` (``changes`` first, its need), every ``moegate builds`` step the real one; each job's
conclusion is act's ``jobResult``. The stand-ins (tooling/ci_replay/README.md): ``vllm/`` is ``cp -a`` of the vLLM
repository at the head (act skips a checkout of the repository it runs, whatever its ``path:``); the published wheel
is a ``file://`` index (``publish``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tooling.ci_replay import compiled_tree
from tooling.ci_replay.common import ANSI
from tooling.ci_replay.standins import rewrite

VLLM_CHECKOUT = (
    r"      - uses: actions/checkout@[0-9a-f]{40} # v[\d.]+\n        with:\n          path: vllm\n"
    r"          fetch-depth: 0\n          persist-credentials: false\n"
)
VLLM_STAND_IN = '      - run: cp -a "$MOEGATE_REPLAY_VLLM" vllm  # ci-replay stand-in: the PR head, fetch-depth 0\n'
INDEX = "wheels-index"  # in the run folder: the merge bases' published wheels, wheels.vllm.ai's layout


def workflow(text: str) -> str:
    """The caller as act runs its wheels job: the vLLM checkout into ``vllm/`` is a copy of the repository."""
    return rewrite(text, VLLM_CHECKOUT, VLLM_STAND_IN, "vLLM checkout into vllm/ -> cp of the repository",
                   "the caller's wheels job", regex=True)  # fmt: skip


def publish(run_dir: Path, commits: list[str]) -> str:
    """The index the pin step reads (``MOEGATE_PRECOMPILED_INDEX``), holding each commit's wheel; its URL."""
    index = run_dir / INDEX
    for commit in commits:
        compiled_tree.publish(index, commit)
    return index.as_uri()


def env(run_dir: Path, case: str, repo_copy: Path, index_url: str) -> dict[str, str]:
    """What act's steps get beside the verdict replay's: the vLLM head, the index, this case's artifact folder."""
    return {
        "MOEGATE_REPLAY_VLLM": str(repo_copy),
        "MOEGATE_PRECOMPILED_INDEX": index_url,
        "MOEGATE_REPLAY_ARTIFACTS": str(run_dir / "artifacts" / case),
    }


def results(records: list[dict[str, Any]]) -> dict[str, str]:
    """Each job's conclusion, by its id, as act ended it (``jobResult``)."""
    return {str(r["jobID"]): str(r["jobResult"]) for r in records if r.get("jobResult") and r.get("jobID")}


def lines(records: list[dict[str, Any]], job: str = "wheels") -> list[tuple[str, str]]:
    """(step, line) of what ``job``'s steps printed, in order, with act's own lines for them (``::error::`` comes as
    one of act's: ``❗  LINE``)."""
    out = []
    for r in records:
        if r.get("jobID") == job and r.get("step"):
            for line in ANSI.sub("", str(r.get("msg", ""))).splitlines():
                out.append((str(r.get("step", "")), line.rstrip()))
    return out


def failed_step(records: list[dict[str, Any]], job: str = "wheels") -> str | None:
    return next((str(r.get("step")) for r in records if r.get("jobID") == job and r.get("stepResult") == "failure"),
                None)  # fmt: skip
