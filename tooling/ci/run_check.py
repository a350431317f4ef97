"""Did a pull request's moegate run do at least what the policy asks? The verdict merging waits on.

The verdict workflow (``examples/vllm-verdict.yml``, on ``workflow_run``: the default branch's definition, out of the
pull request's reach) gathers a ``RunRecord`` from GitHub's API (``tooling/ci/verdict.py``) and ``judge`` decides it
against the ``Policy`` read at the merge base. Everything here is data in, verdict out: no network, no files.

What ran is read where the pull request cannot write it:

- ``path`` and ``referenced``: which workflow file ran and which reusable workflows it called, at which commit
  (the run's ``path`` and ``referenced_workflows``, set by GitHub);
- ``caller``: the caller file at the run's head, parsed as data (never run): its jobs, the inputs it hands moegate;
- ``jobs``: the run's jobs as the API lists them. The legs' names come from moegate's reusable workflow at the
  pinned commit and say what each ran with (``gpu kernels-pr: at least 40 kernel tests``; ``gate_plan.leg_says``).
  Once the caller's own jobs are checked (literal names without `` / ``), no other job can carry such a name;
- ``changed`` and ``moe_paths``: the files the pull request changes (from the API) against the census's list;
- ``label``: the ``equivalent`` label's last application: who, with what access, at which head SHA.

The clauses run in a fixed order and each returns its reasons; the verdict is PASS only when none has one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tooling.ci.gate_plan import gpu_matrix
from tooling.ci.moe_paths import reaching
from tooling.ci.policy import Policy

DISPATCH_JOB = "dispatch tier (CPU, PR build)"
META_JOB = "meta-check (CPU, base must fail)"
INNER_VERDICT_JOB = "moegate verdict"
GPU_JOB = re.compile(r"^gpu (?P<leg>\S+): (?P<says>.+)$")
"""The reusable workflow's job names (``.github/workflows/moegate.yml``; ``test_run_check`` holds them equal)."""
WRITE_ACCESS = ("admin", "maintain", "write")
SHOWN = 6  # changed files a line names before it says "and N more"


@dataclass(frozen=True)
class Job:
    name: str
    conclusion: str | None
    """success, failure, cancelled, skipped, timed_out; None while it runs."""
    labels: tuple[str, ...] = ()
    url: str = ""


@dataclass(frozen=True)
class Label:
    """The equivalent label's last application (a later removal leaves none)."""

    actor: str
    permission: str
    """The actor's access to the repository: admin, maintain, write, triage, read or none."""
    sha: str
    """The pull request's head when the label was applied."""
    at: str = ""


@dataclass(frozen=True)
class RunRecord:
    path: str
    event: str
    head_sha: str
    referenced: tuple[tuple[str, str], ...]
    """(reusable workflow path without its @ref, the commit GitHub resolved it to), as the run lists them."""
    caller: Mapping[str, Any]
    jobs: tuple[Job, ...]
    changed: tuple[str, ...] | None
    """Changed paths (renames: both); None when the API could not list them all (every tier is then required)."""
    moe_paths: tuple[str, ...]
    label: Label | None = None
    url: str = ""
    pr_head: str = ""
    """The pull request's head the label must have been applied at: the run's head, except in a merge queue (whose
    head is the queue's merge commit), where it is the pull request's head."""


@dataclass
class Verdict:
    passed: bool
    reasons: list[str] = field(default_factory=list)
    """Why it FAILs, one line each, in the clauses' order."""
    notes: list[str] = field(default_factory=list)
    """What the verdict went by: the tiers required and why, the label."""

    def headline(self) -> str:
        return f"PASS: {self.notes[0]}" if self.passed else f"FAIL: {self.reasons[0]}"


# --- the clauses ---------------------------------------------------------------------------


def _plain_path(path: str) -> str:
    return path.split("@", 1)[0]


def the_run_is_the_caller(policy: Policy, run: RunRecord) -> list[str]:
    path = _plain_path(run.path)
    if path == policy.caller or path.endswith("/" + policy.caller.lstrip("./")):
        return []
    return [f"the run is of {path}, not the caller {policy.caller}: a workflow named like the caller is not it"]


def it_calls_moegate_at_a_pinned_commit(policy: Policy, run: RunRecord) -> list[str]:
    calls = [(p, sha) for p, sha in run.referenced if _plain_path(p) == policy.reusable]
    others = sorted({_plain_path(p) for p, _ in run.referenced} - {policy.reusable})
    reasons = [f"the run called {o}, which the policy does not know" for o in others]
    if not calls:
        return [f"the run called no {policy.reusable}: nothing of moegate ran", *reasons]
    pins = ", ".join(r[:12] for r in policy.moegate_refs)
    reasons += [f"the run called moegate at {sha[:12]}, not at a commit the policy pins ({pins})"
                for _, sha in calls if sha not in policy.moegate_refs]  # fmt: skip
    return reasons


def _literal(value: Any) -> bool:
    return not (isinstance(value, str) and "${{" in value)


def the_caller_has_the_policys_jobs(policy: Policy, run: RunRecord) -> list[str]:
    jobs = run.caller.get("jobs") if isinstance(run.caller, Mapping) else None
    if not isinstance(jobs, Mapping):
        return [f"{policy.caller} at {run.head_sha[:12]} has no jobs to read"]
    reasons = [f"job {j!r} of the caller is not one of the policy's ({', '.join(policy.caller_jobs)}): "
               "a job beside moegate's could stand in for its legs" for j in jobs if j not in policy.caller_jobs]  # fmt: skip
    for job_id, job in jobs.items():
        if job_id == policy.moegate_job or not isinstance(job, Mapping):
            continue
        name = job.get("name", job_id)
        if "uses" in job:
            reasons.append(f"job {job_id!r} calls a workflow ({job['uses']}); only {policy.moegate_job!r} may")
        if not _literal(name) or " / " in str(name):
            reasons.append(f"job {job_id!r} is named {name!r}: a name made at run time or with ' / ' could be a leg's")
    moegate = jobs.get(policy.moegate_job)
    if not isinstance(moegate, Mapping):
        return [*reasons, f"the caller has no {policy.moegate_job!r} job calling moegate"]
    uses = str(moegate.get("uses", ""))
    path, _, ref = uses.partition("@")
    if path != policy.reusable or ref not in policy.moegate_refs:
        reasons.append(
            f"job {policy.moegate_job!r} uses {uses or 'no workflow'}, not {policy.reusable}@<a pinned commit>"
        )
    given = moegate.get("with") or {}
    if given.get("moegate-repository") != policy.moegate_repository:
        reasons.append(f"moegate-repository is {given.get('moegate-repository')!r}, not {policy.moegate_repository!r}")
    if given.get("moegate-ref") not in policy.moegate_refs:
        reasons.append(f"moegate-ref is {given.get('moegate-ref')!r}, not a commit the policy pins: "
                       "the legs would check out other code")  # fmt: skip
    if not _literal(moegate.get("name", "")):
        reasons.append(f"job {policy.moegate_job!r} has a name made at run time")
    return reasons


def required_tiers(policy: Policy, run: RunRecord) -> tuple[list[str], str]:
    """The tiers this run owed, and the line that says why."""
    if run.changed is None:
        return list(policy.tiers), "the changed files could not all be listed: every tier of the policy"
    hits = reaching(run.changed, run.moe_paths)
    if not hits:
        return ["dispatch"], (
            f"none of the {len(run.changed)} changed files reaches the fused MoE (the census's paths): the dispatch tier alone"
        )
    shown = ", ".join(hits[:SHOWN]) + (f" and {len(hits) - SHOWN} more" if len(hits) > SHOWN else "")
    return list(policy.tiers), f"{len(hits)} of {len(run.changed)} changed files reach the fused MoE ({shown}): " + (
        ", ".join(policy.tiers)
    )


def _prefix(policy: Policy, run: RunRecord) -> str:
    jobs = run.caller.get("jobs") or {}
    job = jobs.get(policy.moegate_job) if isinstance(jobs, Mapping) else None
    name = job.get("name") if isinstance(job, Mapping) else None
    return f"{name or policy.moegate_job} / "


def _moegate_jobs(policy: Policy, run: RunRecord) -> dict[str, Job]:
    prefix = _prefix(policy, run)
    return {j.name[len(prefix) :]: j for j in run.jobs if j.name.startswith(prefix)}


def _gpu_legs(jobs: Mapping[str, Job]) -> dict[str, tuple[str, Job]]:
    legs = {}
    for name, job in jobs.items():
        m = GPU_JOB.match(name)
        if m:
            legs[m.group("leg")] = (m.group("says"), job)
    return legs


def _outcome(job: Job) -> str:
    return f"{job.conclusion or 'not finished'}" + (f" ({job.url})" if job.url else "")


def the_callers_own_jobs_succeeded(policy: Policy, run: RunRecord) -> list[str]:
    """The caller's jobs beside moegate's (``changes``, ``wheels``): one that failed is named first, with its link.

    A failed ``wheels`` job (a compiled MoE change this runner cannot build, builds whose extensions differ) leaves
    moegate's job skipped, so every leg is missing too; this says why. A skipped one is not a reason of its own."""
    jobs = run.caller.get("jobs") if isinstance(run.caller, Mapping) else None
    listed = {j.name: j for j in run.jobs}
    reasons = []
    for job_id, job in jobs.items() if isinstance(jobs, Mapping) else ():
        if job_id == policy.moegate_job or not isinstance(job, Mapping) or "uses" in job:
            continue
        found = listed.get(str(job.get("name", job_id)))
        if found is not None and found.conclusion not in ("success", "skipped"):
            reasons.append(f"the caller's job {job_id!r} ({found.name}): {_outcome(found)}")
    return reasons


def every_owed_leg_passed(policy: Policy, run: RunRecord) -> list[str]:
    tiers, _ = required_tiers(policy, run)
    jobs = _moegate_jobs(policy, run)
    legs = _gpu_legs(jobs)
    want = {"dispatch": DISPATCH_JOB, "meta": META_JOB}
    reasons = []
    for tier in tiers:
        if tier in want:
            job = jobs.get(want[tier])
            if job is None:
                reasons.append(f"the {tier} tier did not run (no job {want[tier]!r})")
            elif job.conclusion != "success":
                reasons.append(f"the {tier} tier: {_outcome(job)}")
    for leg in gpu_matrix(tiers, list(policy.models)):
        found = legs.get(leg["leg"])
        if found is None:
            reasons.append(f"GPU leg {leg['leg']} did not run")
        elif found[1].conclusion != "success":
            reasons.append(f"GPU leg {leg['leg']}: {_outcome(found[1])}")
    inner = jobs.get(INNER_VERDICT_JOB)
    if inner is None or inner.conclusion != "success":
        reasons.append(f"moegate's own verdict job: {_outcome(inner) if inner else 'did not run'}")
    return reasons


SAYS = {
    "kernels": re.compile(r"^at least (?P<n>\d+) kernel tests$"),
    "e2e": re.compile(r"^promise (?P<promise>\w+)$"),
    "ab": re.compile(r"^(?:gating at (?P<threshold>[0-9.e-]+)|(?P<advisory>advisory))$"),
}


def the_legs_ran_as_the_policy_says(policy: Policy, run: RunRecord) -> list[str]:
    reasons = []
    for leg, (says, job) in _gpu_legs(_moegate_jobs(policy, run)).items():
        tier = leg.split("-", 1)[0]
        m = SAYS[tier].match(says) if tier in SAYS else None
        if m is None:
            reasons.append(f"GPU leg {leg} says {says!r}, which the verdict cannot read")
            continue
        missing = [lbl for lbl in policy.runner_labels if lbl not in job.labels]
        if job.conclusion != "skipped" and missing:
            reasons.append(f"GPU leg {leg} ran on {', '.join(job.labels) or 'no labels'}, without {', '.join(missing)}")
        if tier == "kernels" and int(m.group("n")) < policy.min_kernel_tests:
            reasons.append(
                f"GPU leg {leg} asked for {m.group('n')} kernel tests; the policy's floor is {policy.min_kernel_tests}"
            )
        if tier == "ab" and policy.ab_gate and m.group("advisory"):
            reasons.append(f"GPU leg {leg} was advisory; the policy has the A/B gate")
        if (
            tier == "ab"
            and policy.ab_gate
            and m.group("threshold")
            and float(m.group("threshold")) > policy.ab_gate_threshold
        ):
            reasons.append(
                f"GPU leg {leg} gated at {m.group('threshold')}; the policy's threshold is {policy.ab_gate_threshold:g}"
            )
    return reasons


def promised_equivalent(policy: Policy, run: RunRecord) -> list[str]:
    """The e2e legs of the run that promised equivalent (the label is read only where one did)."""
    legs = _gpu_legs(_moegate_jobs(policy, run))
    return sorted(leg for leg, (says, _) in legs.items() if says == "promise equivalent")


def equivalent_only_with_a_label_at_this_head(policy: Policy, run: RunRecord) -> list[str]:
    promised = promised_equivalent(policy, run)
    if not promised:
        return []
    legs = ", ".join(promised)
    if policy.equivalent == "never":
        return [f"{legs} promised equivalent; the policy allows only identical"]
    label, name = run.label, policy.equivalent_label
    if label is None:
        return [f"{legs} promised equivalent without the {name} label"]
    reasons = []
    if label.permission not in WRITE_ACCESS:
        reasons.append(f"the {name} label was applied by {label.actor}, who has {label.permission} access, not write")
    head = run.pr_head or run.head_sha
    if label.sha != head:
        reasons.append(f"the {name} label was applied by {label.actor} at {label.sha[:12]}; this run is at "
                       f"{head[:12]}: a later push drops it (apply it again at this head)")  # fmt: skip
    return reasons


CLAUSES: tuple[Callable[[Policy, RunRecord], list[str]], ...] = (
    the_run_is_the_caller,
    it_calls_moegate_at_a_pinned_commit,
    the_caller_has_the_policys_jobs,
    the_callers_own_jobs_succeeded,
    every_owed_leg_passed,
    the_legs_ran_as_the_policy_says,
    equivalent_only_with_a_label_at_this_head,
)


def judge(policy: Policy, run: RunRecord) -> Verdict:
    reasons = [r for clause in CLAUSES for r in clause(policy, run)]
    _, why = required_tiers(policy, run)
    notes = [why]
    if run.label is not None:
        notes.append(f"{policy.equivalent_label}: applied by {run.label.actor} ({run.label.permission}) "
                     f"at {run.label.sha[:12]}" + (f", {run.label.at}" if run.label.at else ""))  # fmt: skip
    return Verdict(passed=not reasons, reasons=reasons, notes=notes)
