"""The verdict merging waits on: judge a finished caller run against the policy at the merge base, post the status.

    python -m tooling.ci.verdict [--event FILE] [--paths FILE] [--no-post]

Run by the vLLM repository's verdict workflow (``examples/vllm-verdict.yml``) on ``workflow_run``: GitHub runs that
workflow's definition from the default branch, so a pull request cannot edit it. It checks nothing out of the pull
request and runs none of its code: every fact is read from GitHub's API as data (``RunRecord``, in
``tooling/ci/run_check.py``), with the event's ``workflow_run`` saying which run to read:

- the pull request (``pull_requests``, else by its head branch; a merge-queue run by its ``gh-readonly-queue`` branch);
- the merge base and the changed files (``compare BASE...HEAD``: at most 300 files are listed, so more reads as "not
  all listed" and every tier is owed), the policy at the merge base (``tooling.ci.policy.POLICY_PATH`` in the vLLM repository), the caller
  file at the run's head;
- the run's jobs (names, conclusions, runner labels, links);
- where an e2e leg promised ``equivalent``: the label's last ``labeled`` event (who), the actor's permission, and the
  head at that moment: the head SHA of the newest caller run GitHub created for the pull request's branch at or
  before it (a run starts on every push; a push after the label makes a newer head, which the label does not cover).

It writes the report (the verdict's line, every reason, the failing legs with links to their jobs, who applied the
label and at which SHA) to stdout and ``$GITHUB_STEP_SUMMARY``, and posts the commit status ``status-context`` on
the run's head: ``success`` or ``failure``; ``error`` with the one line where it cannot judge. A run whose every job
was skipped (a label that is not the gate's own) posts nothing: the verdict of that head's last run stands.

Exit status: 0 PASS (or nothing to judge), 1 FAIL, 2 it cannot judge (one line: a policy it cannot read, a label
without the SHA it was applied at, an API call that failed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tooling.ci.github_api import Api, ApiError
from tooling.ci.moe_paths import LIST, PathsError, read_list
from tooling.ci.policy import POLICY_PATH, Policy, PolicyError, parse
from tooling.ci.run_check import Job, Label, RunRecord, Verdict, judge, promised_equivalent

COMPARE_FILES_MAX = 300  # GitHub's compare lists at most this many files
QUEUE_BRANCH = re.compile(r"^gh-readonly-queue/(?P<base>.+)/pr-(?P<number>\d+)-[0-9a-f]+$")


class VerdictError(RuntimeError):
    """The verdict cannot be reached: one line, an ``error`` status, exit 2."""


@dataclass(frozen=True)
class Context:
    repo: str
    pr: int
    merge_base: str
    target_url: str


def _pull_request(api: Api, repo: str, wr: dict[str, Any]) -> tuple[int, str]:
    """The pull request's number and its base branch."""
    branch = str(wr.get("head_branch") or "")
    queued = QUEUE_BRANCH.match(branch)
    if wr.get("event") == "merge_group" and queued:
        return int(queued.group("number")), queued.group("base")
    for pr in wr.get("pull_requests") or []:  # empty for a fork's pull request
        return int(pr["number"]), str(pr["base"]["ref"])
    owner = (wr.get("head_repository") or {}).get("owner", {}).get("login", "")
    found = api.get(f"/repos/{repo}/pulls", head=f"{owner}:{branch}", state="all")
    for pr in found if isinstance(found, list) else []:
        return int(pr["number"]), str(pr["base"]["ref"])
    raise VerdictError(f"no pull request has {owner}:{branch} (run {wr.get('id')}) as its head")


def _jobs(api: Api, repo: str, wr: dict[str, Any]) -> tuple[Job, ...]:
    path = f"/repos/{repo}/actions/runs/{wr['id']}/attempts/{wr.get('run_attempt', 1)}/jobs"
    return tuple(
        Job(str(j.get("name", "")), j.get("conclusion"), tuple(j.get("labels") or ()), str(j.get("html_url") or ""))
        for j in api.pages(path, "jobs")
    )


def label_record(api: Api, repo: str, pr: dict[str, Any], name: str, caller: str) -> Label | None:
    """The label's last application (None when the pull request does not carry it)."""
    if name not in {lbl.get("name") for lbl in pr.get("labels") or []}:
        return None
    events = [e for e in api.pages(f"/repos/{repo}/issues/{pr['number']}/events")
              if e.get("event") == "labeled" and (e.get("label") or {}).get("name") == name]  # fmt: skip
    if not events:
        raise VerdictError(f"the {name} label is on #{pr['number']} but no labeled event says who applied it")
    last = max(events, key=lambda e: str(e.get("created_at")))
    actor, at = str((last.get("actor") or {}).get("login", "")), str(last.get("created_at", ""))
    permission = api.get(f"/repos/{repo}/collaborators/{actor}/permission").get("permission", "none")
    head = pr.get("head") or {}
    runs = api.pages(f"/repos/{repo}/actions/workflows/{Path(caller).name}/runs", "workflow_runs",
                     event="pull_request", branch=head.get("ref", ""))  # fmt: skip
    head_repo = (head.get("repo") or {}).get("full_name")
    before = [r for r in runs if str(r.get("created_at", "")) <= at
              and (r.get("head_repository") or {}).get("full_name") == head_repo]  # fmt: skip
    if not before:
        raise VerdictError(f"the {name} label was applied by {actor} at {at} with no run of {repo}/{caller} before it: "
                           "no SHA it was applied at (remove it and apply it again)")  # fmt: skip
    sha = str(max(before, key=lambda r: str(r.get("created_at")))["head_sha"])
    return Label(actor=actor, permission=str(permission), sha=sha, at=at)


def gather(
    api: Api, event: dict[str, Any], jobs: tuple[Job, ...], moe_paths: list[str], target_url: str, seen: dict[str, str]
) -> tuple[Policy, RunRecord, Context]:
    """Everything the verdict goes by; ``seen["context"]`` is set once the policy is read (for an error status)."""
    wr, repo = _run_of(event)
    head = str(wr["head_sha"])
    number, base_ref = _pull_request(api, repo, wr)
    compared = api.get(f"/repos/{repo}/compare/{base_ref}...{head}")
    merge_base = str((compared.get("merge_base_commit") or {}).get("sha", ""))
    if not merge_base:
        raise VerdictError(f"no merge base of {base_ref} and {head[:12]}")
    try:
        text = api.raw(f"/repos/{repo}/contents/{POLICY_PATH}", merge_base)
    except ApiError as exc:
        raise PolicyError(f"{repo}/{POLICY_PATH} at the merge base {merge_base[:12]}: cannot read it ({exc})") from None
    policy = parse(text, f"{repo}/{POLICY_PATH} at {merge_base[:12]}")
    seen["context"] = policy.status_context
    caller: Any = {}
    try:
        caller = _yaml(api.raw(f"/repos/{repo}/contents/{policy.caller}", head))
    except ApiError as exc:
        if exc.status != 404:
            raise
    files = compared.get("files") or []
    changed: tuple[str, ...] | None = tuple(
        sorted({p for f in files for p in (f.get("filename"), f.get("previous_filename")) if p})
    )
    if len(files) >= COMPARE_FILES_MAX:
        changed = None
    pr = api.get(f"/repos/{repo}/pulls/{number}")
    record = RunRecord(
        path=str(wr.get("path", "")),
        event=str(wr.get("event", "")),
        head_sha=head,
        referenced=tuple((str(r.get("path", "")), str(r.get("sha", ""))) for r in wr.get("referenced_workflows") or []),
        caller=caller if isinstance(caller, dict) else {},
        jobs=jobs,
        changed=changed,
        moe_paths=tuple(moe_paths),
        url=str(wr.get("html_url", "")),
        pr_head=str((pr.get("head") or {}).get("sha", head)) if wr.get("event") == "merge_group" else head,
    )
    if promised_equivalent(policy, record):  # who applied the label, and at which head: only where it is needed
        record = dataclasses.replace(record, label=label_record(api, repo, pr, policy.equivalent_label, policy.caller))
    return policy, record, Context(repo, number, merge_base, target_url)


def _run_of(event: dict[str, Any]) -> tuple[dict[str, Any], str]:
    wr, repo = event.get("workflow_run"), (event.get("repository") or {}).get("full_name")
    if not isinstance(wr, dict) or not repo or not wr.get("head_sha") or not wr.get("id"):
        raise VerdictError("the event has no workflow_run (id, head_sha) and repository: run this on workflow_run")
    return wr, str(repo)


def _yaml(text: str) -> Any:
    import yaml  # PyYAML, as the policy: the verdict job installs it

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return {}  # a caller that is not YAML has no jobs: the verdict says so


def report(policy: Policy, run: RunRecord, verdict: Verdict, ctx: Context) -> str:
    lines = [f"## moegate verdict: {verdict.headline()}", ""]
    lines += [f"- FAIL: {r}" for r in verdict.reasons]
    lines += [f"- {n}" for n in verdict.notes]
    if run.label is None:
        lines.append(f"- {policy.equivalent_label}: not read (every e2e leg promised identical), or not on #{ctx.pr}")
    lines += ["", (f"Run {run.url or '?'} at {run.head_sha}, pull request #{ctx.pr}, merge base {ctx.merge_base}, "
              f"policy {POLICY_PATH} there (moegate {', '.join(r[:12] for r in policy.moegate_refs)}).")]  # fmt: skip
    return "\n".join(lines) + "\n"


def post(api: Api, repo: str, sha: str, context: str, state: str, description: str, target_url: str) -> None:
    body = {"state": state, "context": context, "description": description[:140], "target_url": target_url}
    api.post(f"/repos/{repo}/statuses/{sha}", body)


def _summary(text: str) -> None:
    print(text, end="")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
            fh.write(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.ci.verdict", description=__doc__.splitlines()[0])
    ap.add_argument("--event", type=Path, default=os.environ.get("GITHUB_EVENT_PATH"), help="the workflow_run event")
    ap.add_argument("--paths", type=Path, default=LIST, help="the MoE path list (tooling/ci/moe-paths.txt)")
    ap.add_argument("--no-post", action="store_true", help="judge and report, post no status")
    args = ap.parse_args(argv)
    api = Api()
    server, repo_env, run_id = (
        os.environ.get(k, "") for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")
    )
    target = f"{server}/{repo_env}/actions/runs/{run_id}" if server and repo_env and run_id else ""
    event: dict[str, Any] = {}
    seen = {"context": Policy.status_context}
    try:
        if args.event is None:
            raise VerdictError("no event: give --event FILE (GITHUB_EVENT_PATH is not set)")
        try:
            event = json.loads(Path(args.event).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise VerdictError(f"{args.event}: not a readable event ({exc})") from None
        wr, repo = _run_of(event)
        jobs = _jobs(api, repo, wr)
        if jobs and all(j.conclusion == "skipped" for j in jobs):
            print(f"moegate verdict: run {wr['id']} ran no job (a label that is not the gate's own): "
                  "nothing posted, the last verdict at this head stands")  # fmt: skip
            return 0
        policy, run, ctx = gather(api, event, jobs, read_list(args.paths), target, seen)
    except (VerdictError, PolicyError, PathsError, ApiError, KeyError) as exc:
        line = f"moegate verdict: cannot judge: {exc}"
        print(line, file=sys.stderr)
        _error_status(api, event, args.no_post, line, target, seen["context"])
        return 2
    verdict = judge(policy, run)
    _summary(report(policy, run, verdict, ctx))
    if not args.no_post:
        state = "success" if verdict.passed else "failure"
        try:
            post(_status_api(api), ctx.repo, run.head_sha, policy.status_context, state, verdict.headline(), target)
        except ApiError as exc:
            print(f"moegate verdict: could not post the status: {exc}", file=sys.stderr)
            return 2
    return 0 if verdict.passed else 1


def _status_api(api: Api) -> Api:
    """The status is posted with ``MOEGATE_STATUS_TOKEN`` where it is set (the verdict app's token), else as read."""
    token = os.environ.get("MOEGATE_STATUS_TOKEN")
    return Api(api.base, token) if token else api


def _error_status(api: Api, event: dict[str, Any], no_post: bool, line: str, target: str, context: str) -> None:
    """Where the run is known, its head gets an ``error`` status with the line, in the policy's context where the
    policy was read (else the default, ``moegate``)."""
    wr, repo = event.get("workflow_run") or {}, (event.get("repository") or {}).get("full_name")
    if no_post or not wr.get("head_sha") or not repo:
        return
    try:
        post(_status_api(api), repo, wr["head_sha"], context, "error", line, target)
    except ApiError as exc:
        print(f"moegate verdict: could not post the error status either: {exc}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
