"""The workflows' structure: what makes the gate a gate, checked on every change.

Each rule is a function from the parsed workflows to a list of problems; the real
files must have none, and a deliberately broken copy must trip each rule.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from tests.support import ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed here (the unit env has it: nox -s unit)")

FILES = sorted((ROOT / ".github" / "workflows").glob("*.yml")) + [
    ROOT / "examples" / "vllm-caller.yml",
    ROOT / "examples" / "vllm-verdict.yml",
    ROOT / "examples" / "vllm-moe-cache.yml",
]
GATE, REUSABLE, CALLER, VERDICT = "gate.yml", "moegate.yml", "vllm-caller.yml", "vllm-verdict.yml"
FINAL_JOB = {GATE: "gate", REUSABLE: "verdict"}  # the job that must need every other job
PRIVILEGED = ("pull_request_target", "workflow_run")
WORKFLOW_RUN_ONLY_IN = {VERDICT}
"""The one workflow that may run on workflow_run: the verdict, which reads the caller's run as data
(``the_verdict_runs_nothing_of_the_pull_request``). pull_request_target is nowhere."""
GPU_LABELS = {"self-hosted", "gpu"}
SHA_PIN = re.compile(r"^\s*-?\s*uses:\s*([^\s#]+)(?:\s+#\s*(\S.*))?$")

Workflows = dict[str, dict[str, Any]]  # name -> {"text": str, "data": parsed}


def load() -> Workflows:
    return {p.name: {"text": p.read_text(), "data": yaml.safe_load(p.read_text())} for p in FILES}


def _triggers(data: dict[str | bool, Any]) -> dict[str, Any]:
    on = data.get("on", data.get(True))  # YAML 1.1 reads a bare `on` as True
    return on if isinstance(on, dict) else {t: None for t in ([on] if isinstance(on, str) else on or [])}


def _labels(job: dict[str, Any]) -> set[str]:
    runs_on = job.get("runs-on", [])
    if isinstance(runs_on, dict):
        runs_on = runs_on.get("labels", [])
    return {runs_on} if isinstance(runs_on, str) else set(runs_on)


def _gpu_jobs(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: j for n, j in data.get("jobs", {}).items() if "self-hosted" in _labels(j) or "gpu" in n}


# --- the rules ----------------------------------------------------------------------------


def final_job_needs_everything(wfs: Workflows) -> list[str]:
    problems = []
    for name, final in FINAL_JOB.items():
        jobs = wfs[name]["data"]["jobs"]
        if final not in jobs:
            problems.append(f"{name}: no {final!r} job")
            continue
        needs = jobs[final].get("needs", [])
        needs = {needs} if isinstance(needs, str) else set(needs)
        missing = sorted(set(jobs) - {final} - needs)
        if missing:
            problems.append(f"{name}: job {final!r} does not need {', '.join(missing)}")
        if jobs[final].get("if") != "always()":
            problems.append(f"{name}: job {final!r} must run always() so a failed or skipped tier fails it")
    return problems


def gpu_jobs_keep_labels_and_floor(wfs: Workflows) -> list[str]:
    problems = []
    gpu = _gpu_jobs(wfs[REUSABLE]["data"])
    if not gpu:
        problems.append(f"{REUSABLE}: no GPU job")
    for job_name, job in gpu.items():
        if not GPU_LABELS <= _labels(job):
            problems.append(
                f"{REUSABLE}: GPU job {job_name!r} runs on {sorted(_labels(job))}, not on the {sorted(GPU_LABELS)} pool"
            )
        runs = " ".join(str(s.get("run", "")) for s in job.get("steps", []))
        if not re.search(r'tooling\.ci\.gpu_leg kernels [^;]*--min-kernel-tests "\$MIN_KERNEL_TESTS"', runs):
            problems.append(
                f"{REUSABLE}: GPU job {job_name!r} lost its executed-kernel-test minimum (gpu_leg kernels --min-kernel-tests)"
            )
    default = _triggers(wfs[REUSABLE]["data"])["workflow_call"]["inputs"]["min-kernel-tests"].get("default", 0)
    given = wfs[GATE]["data"]["jobs"]["moegate"].get("with", {}).get("min-kernel-tests", default)
    if not (isinstance(default, int) and default > 0 and isinstance(given, int) and given > 0):
        problems.append(f"min-kernel-tests must be at least 1 (default {default!r}, gate.yml passes {given!r})")
    return problems


def nightly_sweeps_the_kernel_tier(wfs: Workflows) -> list[str]:
    """The scheduled run's kernels legs check 5,000 generated cases (nox -s kernel-sweep); PRs do not wait for it."""
    problems = []
    runs = " ".join(str(s.get("run", "")) for job in _gpu_jobs(wfs[REUSABLE]["data"]).values() for s in job["steps"])
    if not re.search(r'tooling\.ci\.gpu_leg kernels [^;]*--sweep-cases "\$SWEEP_CASES"', runs):
        problems.append(f"{REUSABLE}: the kernels legs no longer sweep (gpu_leg kernels --sweep-cases)")
    given = str(wfs[GATE]["data"]["jobs"]["moegate"].get("with", {}).get("kernel-sweep-cases", ""))
    if given != "${{ github.event_name == 'schedule' && 5000 || 0 }}":
        problems.append(f"gate.yml: kernel-sweep-cases is {given!r}, not 5000 on schedule and 0 otherwise")
    return problems


def no_privileged_trigger(wfs: Workflows) -> list[str]:
    problems = []
    for name, wf in wfs.items():
        for trigger in PRIVILEGED:
            if trigger == "workflow_run" and name in WORKFLOW_RUN_ONLY_IN:
                continue
            if trigger in _triggers(wf["data"]) or re.search(rf"^\s*{trigger}\s*:", wf["text"], re.MULTILINE):
                problems.append(f"{name}: privileged trigger {trigger}")
    return problems


def actions_pinned_by_sha(wfs: Workflows) -> list[str]:
    problems = []
    for name, wf in wfs.items():
        for lineno, line in enumerate(wf["text"].splitlines(), 1):
            m = SHA_PIN.match(line)
            if not m or m.group(1).startswith(("./", "$/")):
                continue
            ref = m.group(1).rpartition("@")[2]
            if not re.fullmatch(r"[0-9a-f]{40}", ref):
                problems.append(f"{name}:{lineno}: {m.group(1)} is not pinned by a full commit SHA")
            elif not m.group(2):
                problems.append(f"{name}:{lineno}: {m.group(1)} has no comment naming its tag")
    return problems


def hardened_jobs(wfs: Workflows) -> list[str]:
    """Least privilege, timeouts, no persisted token, no `${{ }}` spliced into a script."""
    problems = []
    for name, wf in wfs.items():
        data = wf["data"]
        if data.get("permissions") != {}:
            problems.append(f"{name}: top-level permissions must be {{}}")
        for job_name, job in data["jobs"].items():
            if "permissions" not in job:
                problems.append(f"{name}: job {job_name!r} declares no permissions")
            if "uses" not in job and "timeout-minutes" not in job:
                problems.append(f"{name}: job {job_name!r} has no timeout-minutes")
            for step in job.get("steps", []):
                if "${{" in str(step.get("run", "")):
                    problems.append(f"{name}: job {job_name!r} splices an expression into a script (use env:)")
                if (
                    str(step.get("uses", "")).startswith("actions/checkout@")
                    and (step.get("with") or {}).get("persist-credentials") is not False
                ):
                    problems.append(f"{name}: job {job_name!r} checks out without persist-credentials: false")
    return problems


CPU_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
GSM8K_SESSIONS = ("unit", "e2e-smoke")  # sessions whose tests read GSM8K (and skip without it)
NOX_SESSION = re.compile(r"\bnox -s ([A-Za-z][\w.-]*(?: [A-Za-z][\w.-]*)*)")


def _hosted_jobs(wfs: Workflows) -> dict[str, dict[str, Any]]:
    """(workflow:job) -> job for every job with steps that runs on GitHub's machines (not self-hosted)."""
    return {
        f"{name}:{job_name}": job
        for name, wf in wfs.items()
        for job_name, job in wf["data"]["jobs"].items()
        if "steps" in job and "self-hosted" not in _labels(job)
    }


def _sessions(step: dict[str, Any]) -> set[str]:
    return {s for m in NOX_SESSION.finditer(str(step.get("run", ""))) for s in m.group(1).split()}


def hosted_nox_jobs_use_cpu_torch(wfs: Workflows) -> list[str]:
    """A hosted job that runs nox builds torch's CPU build (MOEGATE_TORCH_INDEX), never PyPI's CUDA torch.

    Without the index the unit env (also mypy's, in `nox -s lint`) resolves torch from PyPI,
    where 2.13.0 is the CUDA build with its nvidia wheels: gigabytes on every run.
    """
    problems = []
    for where, job in _hosted_jobs(wfs).items():
        if not any(_sessions(s) for s in job["steps"]):
            continue
        name = where.partition(":")[0]
        index = {**(wfs[name]["data"].get("env") or {}), **(job.get("env") or {})}.get("MOEGATE_TORCH_INDEX")
        if index != CPU_TORCH_INDEX:
            problems.append(f"{where} runs nox without MOEGATE_TORCH_INDEX={CPU_TORCH_INDEX} (got {index!r})")
    return problems


def _reads_gsm8k(step: dict[str, Any]) -> bool:
    """A step whose tests or leg read GSM8K: a session of ``GSM8K_SESSIONS``, ``nox -s builds`` (the tiny model's
    tokenizer comes from its train split), or an e2e leg."""
    return bool(_sessions(step) & {*GSM8K_SESSIONS, "builds"}) or "gpu_leg e2e" in str(step.get("run", ""))


def gsm8k_jobs_fetch_it(wfs: Workflows) -> list[str]:
    """A job whose tests or legs read GSM8K fetches it (.ci/gsm8k, sha256-checked) before them, hosted or GPU."""
    problems = []
    jobs = {f"{name}:{jn}": j for name, wf in wfs.items() for jn, j in wf["data"]["jobs"].items() if "steps" in j}
    for where, job in jobs.items():
        steps = job["steps"]
        uses = [i for i, s in enumerate(steps) if _reads_gsm8k(s)]
        if not uses:
            continue
        fetch = [i for i, s in enumerate(steps) if str(s.get("run", "")).strip() == ".ci/gsm8k"]
        if not fetch or fetch[0] > uses[0]:
            what = "/".join(sorted(_sessions(steps[uses[0]]))) or "an e2e leg"
            problems.append(f"{where} runs {what} without .ci/gsm8k before it")
    return problems


def _run_steps(job: dict[str, Any]) -> list[str]:
    return [str(s["run"]) for s in job.get("steps", []) if "run" in s]


def _first(runs: list[str], pattern: str) -> int | None:
    return next((i for i, r in enumerate(runs) if re.search(pattern, r)), None)


def gpu_legs_start_with_preflight(wfs: Workflows) -> list[str]:
    """Every GPU leg's first command is the runner's preflight; the GPU preflight runs before the leg, and the A/B leg
    gets its JSON (the measured UVA read bandwidth, not a default)."""
    problems = []
    for job_name, job in _gpu_jobs(wfs[REUSABLE]["data"]).items():
        runs = _run_steps(job)
        where = f"{REUSABLE}: GPU job {job_name!r}"
        if not runs or runs[0].strip() != "python -m tooling.ci.gpu_leg preflight --start":
            problems.append(f"{where}: its first command is not `python -m tooling.ci.gpu_leg preflight --start`")
        gpu_check, leg = _first(runs, r"gpu_leg preflight --builds"), _first(runs, r"gpu_leg (kernels|e2e|ab) ")
        if gpu_check is None or leg is None or gpu_check > leg:
            problems.append(f"{where}: no `gpu_leg preflight --builds` step before the leg")
        if leg is not None and not re.search(r"gpu_leg ab [^;]*--preflight reports/preflight\.json", runs[leg]):
            problems.append(f"{where}: the ab leg is not handed the preflight's JSON")
    return problems


def the_ab_tier_is_called_ab_and_states_how_it_gates(wfs: Workflows) -> list[str]:
    """One name for the A/B tier (``ab``; ``bench`` is the dispatch benchmark), gating with a stated threshold or
    advisory by the caller's choice, and the verdict job's summary says which."""
    from tooling.ci.gate_plan import TIERS

    problems = []
    data = wfs[REUSABLE]["data"]
    for trigger in ("workflow_call", "workflow_dispatch"):
        inputs = _triggers(data)[trigger]["inputs"]
        if f"comma list from {', '.join(TIERS)}" not in inputs["tiers"]["description"]:
            problems.append(f"{REUSABLE}: {trigger}'s tiers input does not list the plan's tiers {TIERS}")
        if (
            inputs.get("ab-gate", {}).get("type") != "boolean"
            or inputs.get("ab-gate-threshold", {}).get("type") != "number"
        ):
            problems.append(f"{REUSABLE}: {trigger} has no ab-gate (boolean) and ab-gate-threshold (number) inputs")
    if re.search(r"\bbench\b", wfs[REUSABLE]["text"]):
        problems.append(f"{REUSABLE}: still says 'bench' (the A/B tier is 'ab')")
    runs = " ".join(r for job in _gpu_jobs(data).values() for r in _run_steps(job))
    if not re.search(
        r'gate_arg=\(--advisory\)\s+\[ "\$AB_GATE" = true \] && gate_arg=\("--gate-threshold=\$AB_GATE_THRESHOLD"\)',
        runs,
    ):
        problems.append(f"{REUSABLE}: the ab leg does not gate at ab-gate-threshold (or run advisory) as ab-gate says")
    verdict = data["jobs"]["verdict"]
    summary = " ".join(_run_steps(verdict))
    env = {k: str(v) for s in verdict.get("steps", []) for k, v in (s.get("env") or {}).items()}
    if (
        env.get("AB_GATE") != "${{ inputs.ab-gate }}"
        or "GITHUB_STEP_SUMMARY" not in summary
        or "advisory" not in summary
    ):
        problems.append(f"{REUSABLE}: the verdict job's summary does not say whether the A/B gated")
    return problems


VERDICT_PERMISSIONS = {
    "actions": "read",
    "contents": "read",
    "pull-requests": "read",
    "issues": "read",
    "statuses": "write",
}
ATTACKER_FIELDS = re.compile(r"workflow_run\.(head_branch|head_commit|display_title|head_repository|pull_requests)")


def _pinned_moegate(wfs: Workflows) -> set[str]:
    """Every moegate commit the caller and the verdict pin (uses:, moegate-ref, the checkouts): one, or a problem."""
    found = set()
    for name in (CALLER, VERDICT):
        for job in wfs[name]["data"]["jobs"].values():
            if "uses" in job:
                found.add(str(job["uses"]).rpartition("@")[2])
                found.add(str((job.get("with") or {}).get("moegate-ref")))
            for step in job.get("steps", []):
                given = step.get("with") or {}
                if given.get("repository") == "your-org/moegate":
                    found.add(str(given.get("ref")))
    return found


def the_verdict_runs_nothing_of_the_pull_request(wfs: Workflows) -> list[str]:
    """The workflow_run verdict: the caller's completed runs only, least privilege, moegate's code at the pinned
    commit, no artifact of the run downloaded, no string the pull request controls spliced anywhere."""
    problems = []
    data, text = wfs[VERDICT]["data"], wfs[VERDICT]["text"]
    trigger = _triggers(data).get("workflow_run") or {}
    caller_name = wfs[CALLER]["data"].get("name")
    if (
        set(_triggers(data)) != {"workflow_run"}
        or trigger.get("workflows") != [caller_name]
        or trigger.get("types") != ["completed"]
    ):
        problems.append(f"{VERDICT}: must run on workflow_run of [{caller_name}] (completed) and nothing else")
    for job_name, job in data["jobs"].items():
        if job.get("permissions") != VERDICT_PERMISSIONS:
            problems.append(f"{VERDICT}: job {job_name!r} asks for {job.get('permissions')}, not {VERDICT_PERMISSIONS}")
        for step in job.get("steps", []):
            uses, given = str(step.get("uses", "")), step.get("with") or {}
            if uses.startswith("actions/checkout@") and (
                given.get("repository") != "your-org/moegate"
                or not re.fullmatch(r"[0-9a-f]{40}", str(given.get("ref")))
            ):
                problems.append(
                    f"{VERDICT}: job {job_name!r} checks out something other than moegate at a pinned commit"
                )
            if "download-artifact" in uses:
                problems.append(f"{VERDICT}: job {job_name!r} downloads an artifact of the run it judges")
    spliced = ATTACKER_FIELDS.search(text)
    if spliced:
        problems.append(f"{VERDICT}: uses a field of the run that the pull request writes ({spliced.group(0)})")
    if "python -m tooling.ci.verdict" not in " ".join(_run_steps(next(iter(data["jobs"].values())))):
        problems.append(f"{VERDICT}: does not run python -m tooling.ci.verdict")
    pins = _pinned_moegate(wfs)
    if len(pins) != 1:
        problems.append(f"{CALLER} and {VERDICT} pin more than one moegate commit: {sorted(pins)}")
    return problems


GATE_LABELS = ("gpu-ok", "moegate-equivalent")


def _needs(job: dict[str, Any]) -> set[str]:
    needs = job.get("needs", [])
    return {needs} if isinstance(needs, str) else set(needs)


def the_caller_filters_by_paths_and_labels_and_handles_the_queue(wfs: Workflows) -> list[str]:
    """Dispatch on every PR, the GPU legs by the census's paths, only the gate's own labels restart it, merge_group."""
    problems = []
    data = wfs[CALLER]["data"]
    on = _triggers(data)
    if "merge_group" not in on:
        problems.append(f"{CALLER}: no merge_group trigger: a required check would stall a merge queue")
    jobs = data["jobs"]
    first = jobs.get("changes", {})
    condition = " ".join(str(first.get("if", "")).split())
    labels = set(re.findall(r"github\.event\.label\.name == '([^']+)'", condition))
    if "github.event.action != 'labeled'" not in condition or labels != set(GATE_LABELS):
        problems.append(
            f"{CALLER}: job 'changes' does not skip every label but the gate's own ({', '.join(GATE_LABELS)})"
        )
    for job_name, job in jobs.items():
        if job_name != "changes" and "changes" not in _needs(job):
            problems.append(f"{CALLER}: job {job_name!r} does not need 'changes', so another label would run it")
    group = " ".join(str((data.get("concurrency") or {}).get("group", "")).split())
    if "github.run_id" not in group or not all(f"'{lbl}'" in group for lbl in GATE_LABELS):
        problems.append(f"{CALLER}: another label's run shares the PR's concurrency group and would cancel the gate")
    if not any("tooling.ci.moe_paths match" in r for r in _run_steps(first)):
        problems.append(f"{CALLER}: job 'changes' does not match the changed paths against the census's list")
    given = (jobs.get("moegate") or {}).get("with") or {}
    if given.get("tiers") != "${{ needs.changes.outputs.tiers }}":
        problems.append(f"{CALLER}: the tiers are {given.get('tiers')!r}, not the changes job's")
    if "gpu-runner-label" not in given:
        problems.append(f"{CALLER}: the GPU pool's label is not passed (gpu-runner-label)")
    return problems


def every_failing_leg_is_named_with_its_page(wfs: Workflows) -> list[str]:
    """Each tier job marks its leg (outcome, page) before its upload; the verdict job names the failing ones."""
    problems = []
    jobs = wfs[REUSABLE]["data"]["jobs"]
    for job_name in ("dispatch", "meta", "gpu"):
        steps = jobs[job_name]["steps"]
        mark = next((i for i, s in enumerate(steps) if "tooling.ci.leg_pages mark" in str(s.get("run", ""))), None)
        upload = next((i for i, s in enumerate(steps) if "upload-artifact" in str(s.get("uses", ""))
                       and str((s.get("with") or {}).get("name", "")).startswith("moegate-")), None)  # fmt: skip
        if mark is None or upload is None or mark > upload or steps[mark].get("if") != "always()":
            problems.append(f"{REUSABLE}: job {job_name!r} does not mark its leg (always()) before its upload")
    if not any("tooling.ci.leg_pages verdict" in r for r in _run_steps(jobs["verdict"])):
        problems.append(f"{REUSABLE}: the verdict job does not name each failing leg (tooling.ci.leg_pages verdict)")
    env = wfs[REUSABLE]["data"].get("env") or {}
    if (
        env.get("MOEGATE_EXAMPLES")
        != "${{ inputs.moegate-repository == '' || inputs.moegate-repository == github.repository }}"
    ):
        problems.append(f"{REUSABLE}: @example lines are not kept to moegate's own runs (MOEGATE_EXAMPLES)")
    return problems


NIGHTLY = "vllm-main.yml"


def the_nightly_tells_no_fit_apart_from_fail(wfs: Workflows) -> list[str]:
    """Against vLLM's main branch: the fit probe before any case, the gate only where it fits, three outcomes."""
    problems = []
    data = wfs[NIGHTLY]["data"]
    if set(_triggers(data)) - {"schedule", "workflow_dispatch"}:
        problems.append(f"{NIGHTLY}: runs on more than its schedule and dispatch")
    jobs = data["jobs"]
    fit_runs = " ".join(_run_steps(jobs["fit"]))
    if "nox -s fit" not in fit_runs or "tooling.ci.vllm_main fit" not in fit_runs:
        problems.append(f"{NIGHTLY}: the fit job does not probe the build (nox -s fit) before any case")
    if jobs["gate"].get("if") != "needs.fit.outputs.fits == 'true'" or "fit" not in _needs(jobs["gate"]):
        problems.append(f"{NIGHTLY}: the gate runs where moegate does not fit (its FAIL would be upkeep)")
    report = " ".join(_run_steps(jobs["report"]))
    if not all(w in report for w in ("moegate no longer fits this vLLM", "PASS: vLLM main", "FAIL: vLLM main")):
        problems.append(f"{NIGHTLY}: the report does not tell PASS, FAIL and no longer fits apart")
    return problems


RULES = [
    final_job_needs_everything,
    gpu_jobs_keep_labels_and_floor,
    nightly_sweeps_the_kernel_tier,
    no_privileged_trigger,
    actions_pinned_by_sha,
    hardened_jobs,
    hosted_nox_jobs_use_cpu_torch,
    gsm8k_jobs_fetch_it,
    gpu_legs_start_with_preflight,
    the_ab_tier_is_called_ab_and_states_how_it_gates,
    the_verdict_runs_nothing_of_the_pull_request,
    the_caller_filters_by_paths_and_labels_and_handles_the_queue,
    every_failing_leg_is_named_with_its_page,
    the_nightly_tells_no_fit_apart_from_fail,
]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_the_workflows_keep_the_rule(rule):
    assert rule(load()) == []


# --- each rule trips on a broken copy -----------------------------------------------------


def _broken(edit) -> Workflows:
    wfs = copy.deepcopy(load())
    edit(wfs)
    return wfs


def _drop_need(wfs: Workflows) -> None:
    wfs[GATE]["data"]["jobs"]["gate"]["needs"].remove("moegate")


def _new_tier_job(wfs: Workflows) -> None:
    wfs[REUSABLE]["data"]["jobs"]["e2e-extra"] = {"runs-on": "ubuntu-24.04", "permissions": {}, "timeout-minutes": 5}


def _drop_labels(wfs: Workflows) -> None:
    wfs[REUSABLE]["data"]["jobs"]["gpu"]["runs-on"] = ["self-hosted", "linux"]


def _gpu_steps(wfs: Workflows) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = wfs[REUSABLE]["data"]["jobs"]["gpu"]["steps"]
    return steps


def _edit_run(wfs: Workflows, old: str, new: str) -> None:
    for step in _gpu_steps(wfs):
        if old in str(step.get("run", "")):
            step["run"] = step["run"].replace(old, new)


def _drop_floor(wfs: Workflows) -> None:
    _edit_run(wfs, '--min-kernel-tests "$MIN_KERNEL_TESTS"', "")


def _preflight_not_first(wfs: Workflows) -> None:
    steps = _gpu_steps(wfs)
    start = next(s for s in steps if "preflight --start" in str(s.get("run", "")))
    steps.remove(start)
    steps.insert(len(steps) - 3, start)


def _ab_without_preflight(wfs: Workflows) -> None:
    _edit_run(wfs, "--preflight reports/preflight.json", "")


def _no_gpu_preflight(wfs: Workflows) -> None:
    wfs[REUSABLE]["data"]["jobs"]["gpu"]["steps"] = [
        s for s in _gpu_steps(wfs) if "gpu_leg preflight --builds" not in str(s.get("run", ""))
    ]


def _gpu_without_gsm8k(wfs: Workflows) -> None:
    wfs[REUSABLE]["data"]["jobs"]["gpu"]["steps"] = [s for s in _gpu_steps(wfs) if s.get("run") != ".ci/gsm8k"]


def _bench_again(wfs: Workflows) -> None:
    wfs[REUSABLE]["text"] += "\n# ab) nox -s bench\n"


def _ab_never_gates(wfs: Workflows) -> None:
    _edit_run(wfs, '&& gate_arg=("--gate-threshold=$AB_GATE_THRESHOLD")', "")


def _silent_verdict(wfs: Workflows) -> None:
    for step in wfs[REUSABLE]["data"]["jobs"]["verdict"]["steps"]:
        if "run" in step:
            step["run"] = step["run"].replace('echo "$ab" >> "$GITHUB_STEP_SUMMARY"', "")


def _zero_floor(wfs: Workflows) -> None:
    wfs[GATE]["data"]["jobs"]["moegate"]["with"]["min-kernel-tests"] = 0


def _no_sweep(wfs: Workflows) -> None:
    wfs[GATE]["data"]["jobs"]["moegate"]["with"].pop("kernel-sweep-cases")


def _privileged(wfs: Workflows) -> None:
    wfs[GATE]["text"] = wfs[GATE]["text"].replace("  pull_request:\n", "  pull_request_target:\n", 1)
    wfs[GATE]["data"]["on" if "on" in wfs[GATE]["data"] else True]["pull_request_target"] = None


def _workflow_run(wfs: Workflows) -> None:
    wfs["vllm-caller.yml"]["text"] += "\n# smuggled\non2:\n  workflow_run:\n    workflows: [x]\n"


def _tag_pin(wfs: Workflows) -> None:
    wfs[REUSABLE]["text"] = re.sub(
        r"actions/upload-artifact@[0-9a-f]{40}", "actions/upload-artifact@v6", wfs[REUSABLE]["text"], count=1
    )


def _no_tag_comment(wfs: Workflows) -> None:
    wfs[GATE]["text"] = re.sub(r"(actions/checkout@[0-9a-f]{40}) # \S+", r"\1", wfs[GATE]["text"], count=1)


def _splice(wfs: Workflows) -> None:
    wfs[GATE]["data"]["jobs"]["unit"]["steps"].append({"run": "echo ${{ github.head_ref }}"})


def _persisted_token(wfs: Workflows) -> None:
    wfs[GATE]["data"]["jobs"]["lint"]["steps"][0]["with"].pop("persist-credentials")


def _no_timeout(wfs: Workflows) -> None:
    wfs[REUSABLE]["data"]["jobs"]["plan"].pop("timeout-minutes")


def _lint_without_cpu_torch(wfs: Workflows) -> None:
    wfs[GATE]["data"]["jobs"]["lint"].pop("env")


def _meta_on_pypi_torch(wfs: Workflows) -> None:
    wfs[REUSABLE]["data"]["jobs"]["meta"]["env"]["MOEGATE_TORCH_INDEX"] = "https://pypi.org/simple"


def _unit_without_gsm8k(wfs: Workflows) -> None:
    steps = wfs[GATE]["data"]["jobs"]["unit"]["steps"]
    wfs[GATE]["data"]["jobs"]["unit"]["steps"] = [s for s in steps if s.get("run") != ".ci/gsm8k"]


def _gsm8k_too_late(wfs: Workflows) -> None:
    steps = wfs[GATE]["data"]["jobs"]["e2e-smoke"]["steps"]
    fetch = next(s for s in steps if s.get("run") == ".ci/gsm8k")
    steps.remove(fetch)
    steps.append(fetch)


def _verdict_job(wfs: Workflows) -> dict[str, Any]:
    job: dict[str, Any] = next(iter(wfs[VERDICT]["data"]["jobs"].values()))
    return job


def _verdict_checks_out_the_pr(wfs: Workflows) -> None:
    for step in _verdict_job(wfs)["steps"]:
        if str(step.get("uses", "")).startswith("actions/checkout@"):
            step["with"]["repository"] = "${{ github.event.workflow_run.head_repository.full_name }}"


def _verdict_downloads(wfs: Workflows) -> None:
    _verdict_job(wfs)["steps"].append({"uses": "actions/download-artifact@37930b1c2abaa49bbe596cd826c3c89aef350131"})


def _verdict_writes(wfs: Workflows) -> None:
    _verdict_job(wfs)["permissions"]["contents"] = "write"


def _verdict_splices_the_branch(wfs: Workflows) -> None:
    wfs[VERDICT]["text"] += "\n# ${{ github.event.workflow_run.head_branch }}\n"


def _verdict_on_pushes(wfs: Workflows) -> None:
    wfs[VERDICT]["data"][True if True in wfs[VERDICT]["data"] else "on"]["push"] = None


def _caller_other_pin(wfs: Workflows) -> None:
    wfs[CALLER]["data"]["jobs"]["moegate"]["with"]["moegate-ref"] = "f" * 40


def _no_queue(wfs: Workflows) -> None:
    wfs[CALLER]["data"][True if True in wfs[CALLER]["data"] else "on"].pop("merge_group")


def _every_label_restarts(wfs: Workflows) -> None:
    wfs[CALLER]["data"]["jobs"]["changes"].pop("if")


def _wheels_on_any_label(wfs: Workflows) -> None:
    wfs[CALLER]["data"]["jobs"]["wheels"].pop("needs")


def _shared_group(wfs: Workflows) -> None:
    wfs[CALLER]["data"]["concurrency"]["group"] = "moegate-caller-${{ github.ref }}"


def _fixed_tiers(wfs: Workflows) -> None:
    wfs[CALLER]["data"]["jobs"]["moegate"]["with"]["tiers"] = "dispatch,kernels,e2e"


def _unmarked_gpu_leg(wfs: Workflows) -> None:
    _gpu_steps(wfs)[:] = [s for s in _gpu_steps(wfs) if "leg_pages mark" not in str(s.get("run", ""))]


def _unnamed_legs(wfs: Workflows) -> None:
    steps = wfs[REUSABLE]["data"]["jobs"]["verdict"]["steps"]
    steps[:] = [s for s in steps if "leg_pages verdict" not in str(s.get("run", ""))]


def _gate_without_fit(wfs: Workflows) -> None:
    wfs[NIGHTLY]["data"]["jobs"]["gate"].pop("if")


def _one_outcome(wfs: Workflows) -> None:
    for step in wfs[NIGHTLY]["data"]["jobs"]["report"]["steps"]:
        step["run"] = step["run"].replace("moegate no longer fits this vLLM", "FAIL")


def _examples_everywhere(wfs: Workflows) -> None:
    wfs[REUSABLE]["data"]["env"]["MOEGATE_EXAMPLES"] = "true"


@pytest.mark.parametrize(
    ("edit", "rule", "says"),
    [
        (
            _verdict_checks_out_the_pr,
            the_verdict_runs_nothing_of_the_pull_request,
            "checks out something other than moegate",
        ),
        (
            _verdict_downloads,
            the_verdict_runs_nothing_of_the_pull_request,
            "downloads an artifact of the run it judges",
        ),
        (_verdict_writes, the_verdict_runs_nothing_of_the_pull_request, "asks for {"),
        (_verdict_splices_the_branch, the_verdict_runs_nothing_of_the_pull_request, "(workflow_run.head_branch)"),
        (_verdict_on_pushes, the_verdict_runs_nothing_of_the_pull_request, "must run on workflow_run of [moegate]"),
        (_caller_other_pin, the_verdict_runs_nothing_of_the_pull_request, "pin more than one moegate commit"),
        (_no_queue, the_caller_filters_by_paths_and_labels_and_handles_the_queue, "no merge_group trigger"),
        (
            _every_label_restarts,
            the_caller_filters_by_paths_and_labels_and_handles_the_queue,
            "does not skip every label",
        ),
        (
            _wheels_on_any_label,
            the_caller_filters_by_paths_and_labels_and_handles_the_queue,
            "job 'wheels' does not need",
        ),
        (_shared_group, the_caller_filters_by_paths_and_labels_and_handles_the_queue, "would cancel the gate"),
        (_fixed_tiers, the_caller_filters_by_paths_and_labels_and_handles_the_queue, "not the changes job's"),
        (_unmarked_gpu_leg, every_failing_leg_is_named_with_its_page, "job 'gpu' does not mark its leg"),
        (_unnamed_legs, every_failing_leg_is_named_with_its_page, "does not name each failing leg"),
        (_examples_everywhere, every_failing_leg_is_named_with_its_page, "@example lines are not kept"),
        (_gate_without_fit, the_nightly_tells_no_fit_apart_from_fail, "the gate runs where moegate does not fit"),
        (_one_outcome, the_nightly_tells_no_fit_apart_from_fail, "does not tell PASS, FAIL and no longer fits apart"),
        (_drop_need, final_job_needs_everything, "job 'gate' does not need moegate"),
        (_new_tier_job, final_job_needs_everything, "job 'verdict' does not need e2e-extra"),
        (_drop_labels, gpu_jobs_keep_labels_and_floor, "not on the ['gpu', 'self-hosted'] pool"),
        (_drop_floor, gpu_jobs_keep_labels_and_floor, "lost its executed-kernel-test minimum"),
        (_preflight_not_first, gpu_legs_start_with_preflight, "its first command is not"),
        (_no_gpu_preflight, gpu_legs_start_with_preflight, "no `gpu_leg preflight --builds` step before the leg"),
        (_ab_without_preflight, gpu_legs_start_with_preflight, "the ab leg is not handed the preflight's JSON"),
        (_gpu_without_gsm8k, gsm8k_jobs_fetch_it, "moegate.yml:gpu runs builds without .ci/gsm8k before it"),
        (_bench_again, the_ab_tier_is_called_ab_and_states_how_it_gates, "still says 'bench'"),
        (_ab_never_gates, the_ab_tier_is_called_ab_and_states_how_it_gates, "does not gate at ab-gate-threshold"),
        (
            _silent_verdict,
            the_ab_tier_is_called_ab_and_states_how_it_gates,
            "summary does not say whether the A/B gated",
        ),
        (_zero_floor, gpu_jobs_keep_labels_and_floor, "gate.yml passes 0"),
        (_no_sweep, nightly_sweeps_the_kernel_tier, "kernel-sweep-cases is '', not 5000 on schedule"),
        (_privileged, no_privileged_trigger, "gate.yml: privileged trigger pull_request_target"),
        (_workflow_run, no_privileged_trigger, "vllm-caller.yml: privileged trigger workflow_run"),
        (_tag_pin, actions_pinned_by_sha, "actions/upload-artifact@v6 is not pinned by a full commit SHA"),
        (_no_tag_comment, actions_pinned_by_sha, "has no comment naming its tag"),
        (_splice, hardened_jobs, "splices an expression into a script"),
        (_persisted_token, hardened_jobs, "without persist-credentials: false"),
        (_no_timeout, hardened_jobs, "job 'plan' has no timeout-minutes"),
        (_lint_without_cpu_torch, hosted_nox_jobs_use_cpu_torch, "gate.yml:lint runs nox without MOEGATE_TORCH_INDEX"),
        (_meta_on_pypi_torch, hosted_nox_jobs_use_cpu_torch, "moegate.yml:meta runs nox without"),
        (
            _unit_without_gsm8k,
            gsm8k_jobs_fetch_it,
            "gate.yml:unit runs unit/wheel-check without .ci/gsm8k before it",
        ),
        (_gsm8k_too_late, gsm8k_jobs_fetch_it, "gate.yml:e2e-smoke runs ab-smoke/e2e-smoke without .ci/gsm8k"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_a_broken_copy_trips_the_rule(edit, rule, says):
    problems = rule(_broken(edit))
    assert any(says in p for p in problems), problems


CODEOWNED = ("/.github/", "/noxfile.py", "/.ci/", "/tooling/ci/", "/tooling/serving.py")
"""Where the GPU job's commands come from: the workflows, the sessions, the job scripts, the legs and their flags."""


def _unowned(text: str) -> list[str]:
    owned = {line.split()[0] for line in text.splitlines() if line.strip() and not line.startswith("#")}
    return [path for path in CODEOWNED if path not in owned]


def test_codeowners_cover_everything_the_gpu_job_runs():
    assert _unowned((ROOT / ".github" / "CODEOWNERS").read_text()) == []
    assert _unowned("/.github/ @x\n/.ci/ @x\n") == ["/noxfile.py", "/tooling/ci/", "/tooling/serving.py"]
