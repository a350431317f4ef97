"""The verdict's cases (issue 44's done-when list): a vLLM-like repository, one pull request branch a case, and the run.

``make_repo`` builds a real git repository: ``main`` holds the example caller, verdict and policy
(``examples/vllm-caller.yml``, ``vllm-verdict.yml``, ``moegate-policy.yml``, as committed) and a few vLLM files; each
case is a branch off it with the commits a pull request would push. ``scenario`` then gives what GitHub would hold for
that case's run: the pull request, the label's events, the actors' access, the caller's earlier runs, and the run's
jobs as GitHub lists them for the caller at the case's head (``run_jobs``: each job of the caller by its name, the
reusable workflow's expanded as moegate.yml names them at the plan's legs; every job succeeded, so only what the run
*did* decides, but for the caller's jobs the replay ran: their conclusions are act's). ``workflow_run_event`` is the
event GitHub hands the verdict. The compiled-source cases' ``main`` also holds the step tests' vLLM tree
(``compiled_tree.py``) and their base may turn the caller's MoE rebuild off (``no-rebuild-main``).

The ``changes`` job's outputs (the tiers, the promise) are the one thing of the run a case computes: the replay takes
them from act running that job of the caller on the case's branch; the unit tests from the same matcher
(``tooling.ci.moe_paths.reaching``) over ``git diff``.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from moegate.builds.changes import compiled_changes
from moegate.paths import ROOT
from tooling.ci.gate_plan import plan
from tooling.ci.moe_paths import LIST, reaching, read_list
from tooling.ci_replay import compiled_tree
from tooling.ci_replay.fake_github import Scenario

REPO = "vllm-project/vllm"
CALLER_PATH = ".github/workflows/moegate.yml"
POLICY_PATH = ".github/moegate-policy.yml"
EXAMPLES = ROOT / "examples"
PIN = str(yaml.safe_load((EXAMPLES / "moegate-policy.yml").read_text())["moegate-refs"][0])
OTHER_REF = "fedcba98" * 5  # a moegate commit the policy does not pin
MAINTAINER, READER, BOT = "a-maintainer", "a-reader", "a-bot"
PERMISSIONS = {MAINTAINER: "write", READER: "read", BOT: "none"}
MOE_FILE = "vllm/model_executor/layers/fused_moe/layer.py"
DOCS_FILE = "docs/usage.md"
MOE_SOURCE = "csrc/moe/moe_align_sum_kernels.cu"
MOE_PYTHON = "vllm/model_executor/layers/fused_moe/fused_moe.py"
NO_REBUILD_MAIN = "no-rebuild-main"  # main with the caller's REBUILD_MOE "false": its runners cannot build the MoE ops
CANNOT_BUILD = f"compiled MoE sources changed ({MOE_SOURCE}): this runner cannot build them"
RUN_ID = 4242
MOEGATE_NEEDS = re.compile(r"^\$\{\{ *needs\.changes\.outputs\.(\w+) *\}\}$")


def _git(repo: Path, *args: str) -> str:
    git = [
        "git",
        "-C",
        str(repo),
        "-c",
        "user.name=replay",
        "-c",
        "user.email=replay@localhost",
        "-c",
        "commit.gpgsign=false",
    ]
    return subprocess.run([*git, *args], check=True, capture_output=True, text=True).stdout.strip()


def _write(repo: Path, rel: str, text: str) -> None:
    (repo / rel).parent.mkdir(parents=True, exist_ok=True)
    (repo / rel).write_text(text)


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@dataclass(frozen=True)
class Case:
    name: str
    shows: str
    """The done-when line it shows."""
    edit: Callable[[Path], None]
    want_state: str
    """The status the verdict must post: success, failure, error."""
    want_exit: int
    want_line: str
    """A line the verdict must print (its report, or its one line)."""
    label: str | None = None
    """Who applies the equivalent label: "head" (at the head), "earlier" (before a later push), "early" (before any run)."""
    labeller: str = MAINTAINER
    base: str = "main"
    wheels: str | None = None
    """The conclusion the caller's ``wheels`` job must reach where the replay runs it through act (None: not run)."""
    wheels_line: str = ""
    """A line the wheels job must print."""


Heads = dict[str, list[str]]
"""Each case's commits, oldest first: the last is the run's head."""


def _caller(edit: Callable[[str], str]) -> Callable[[Path], None]:
    def apply(repo: Path) -> None:
        _write(repo, CALLER_PATH, edit((repo / CALLER_PATH).read_text()))
        _touch_moe(repo)

    return apply


def _touch_moe(repo: Path) -> None:
    _write(repo, MOE_FILE, (repo / MOE_FILE).read_text() + "# a change to the fused-MoE layer\n")


def _touch_docs(repo: Path) -> None:
    _write(repo, DOCS_FILE, (repo / DOCS_FILE).read_text() + "A sentence more.\n")


IMPOSTOR_JOB = """
  verdict:
    name: moegate / moegate verdict
    runs-on: ubuntu-24.04
    permissions: {}
    timeout-minutes: 1
    steps:
      - run: echo PASS
"""
REPLACED_CALLER = """name: moegate
on:
  pull_request:
permissions: {}
jobs:
  verdict:
    name: moegate verdict
    runs-on: ubuntu-24.04
    permissions: {}
    timeout-minutes: 1
    steps:
      - run: echo PASS
"""


def _replace_caller(repo: Path) -> None:
    _write(repo, CALLER_PATH, REPLACED_CALLER)
    _touch_moe(repo)


def _break_policy(repo: Path) -> None:
    _write(repo, POLICY_PATH, (repo / POLICY_PATH).read_text() + "tiers-extra: [everything]\n")


def _no_rebuild(repo: Path) -> None:
    text = (repo / CALLER_PATH).read_text()
    if '      REBUILD_MOE: "true"' not in text:
        raise ValueError('the example caller\'s wheels job sets no REBUILD_MOE "true" to turn off')
    _write(repo, CALLER_PATH, text.replace('      REBUILD_MOE: "true"', '      REBUILD_MOE: "false"', 1))


def _touch_moe_source(repo: Path) -> None:
    _write(repo, MOE_SOURCE, (repo / MOE_SOURCE).read_text() + "// a change to the block alignment\n")


def _touch_moe_python(repo: Path) -> None:
    _write(repo, MOE_PYTHON, (repo / MOE_PYTHON).read_text() + "# a Python-only change to the fused MoE\n")


CASES = (
    Case("docs-only", "a docs-only PR gets the dispatch tier alone and PASS, with the line", _touch_docs,
         "success", 0, "none of the 1 changed files reaches the fused MoE (the census's paths): the dispatch tier alone"),
    Case("moe-change", "(control) a PR that reaches the fused MoE gets every tier and PASS", _touch_moe,
         "success", 0, f"1 of 1 changed files reach the fused MoE ({MOE_FILE}): dispatch, kernels, e2e, ab"),
    Case("caller-tiers-dispatch", "a PR that edits its caller to `tiers: dispatch` does not pass",
         _caller(lambda t: re.sub(r"tiers: \$\{\{ needs\.changes\.outputs\.tiers \}\}", "tiers: dispatch", t)),
         "failure", 1, "GPU leg kernels-pr did not run"),
    Case("caller-other-ref", "a PR that points the caller's `uses:` at another moegate ref does not pass",
         _caller(lambda t: t.replace(PIN, OTHER_REF)), "failure", 1,
         f"the run called moegate at {OTHER_REF[:12]}, not at a commit the policy pins ({PIN[:12]})"),
    Case("caller-impostor-job", "a PR that adds an impostor `moegate verdict` job to its caller does not pass",
         _caller(lambda t: t.rstrip("\n") + "\n" + IMPOSTOR_JOB), "failure", 1,
         "job 'verdict' of the caller is not one of the policy's (changes, wheels, moegate)"),
    Case("caller-replaced", "a PR that replaces its caller with one job named `moegate verdict` does not pass",
         _replace_caller, "failure", 1, "the run called no your-org/moegate/.github/workflows/moegate.yml"),
    Case("equivalent-no-label", "`equivalent` without a label FAILs",
         _caller(lambda t: t.replace("promise: ${{ needs.changes.outputs.promise }}", "promise: equivalent")),
         "failure", 1, "promised equivalent without the moegate-equivalent label"),
    Case("equivalent-earlier-label", "`equivalent` with a label from an earlier SHA FAILs", _touch_moe,
         "failure", 1, "a later push drops it", label="earlier"),
    Case("equivalent-label-at-head", "(control) `equivalent` with the label at the head, by a writer, PASSes", _touch_moe,
         "success", 0, f"moegate-equivalent: applied by {MAINTAINER} (write) at", label="head"),
    Case("equivalent-label-by-reader", "`equivalent` from a label applied without write access FAILs", _touch_moe,
         "failure", 1, f"applied by {READER}, who has read access, not write", label="head", labeller=READER),
    Case("policy-unreadable", "a policy the verdict cannot read: one line, an error status, exit 2", _touch_moe,
         "error", 2, f"moegate verdict: cannot judge: {REPO}/.github/moegate-policy.yml at", base="broken-main"),
    Case("label-without-sha", "a label without the SHA it was applied at: one line, an error status, exit 2",
         _touch_moe, "error", 2, "no SHA it was applied at", label="early"),
    Case("moe-sources-no-rebuild", "a PR that touches the MoE ops' sources without a rebuild gets FAIL, with the line",
         _touch_moe_source, "failure", 1, "the caller's job 'wheels' (base and PR wheels): failure",
         base=NO_REBUILD_MAIN, wheels="failure", wheels_line=CANNOT_BUILD),
    Case("python-only-identical-hashes", "a PR whose compiled sources did not change shows identical extension "
         "hashes in both builds", _touch_moe_python, "success", 0,
         f"1 of 1 changed files reach the fused MoE ({MOE_PYTHON}): dispatch, kernels, e2e, ab", wheels="success",
         wheels_line="PASS: no compiled source changed; the 2 extensions are identical in both builds"),
)  # fmt: skip


def make_repo(dest: Path) -> Heads:
    """``main`` (and ``broken-main``, whose policy is not a policy), then one branch a case; each case's heads."""
    _git(dest.parent, "init", "-q", "-b", "main", str(dest))
    _write(dest, CALLER_PATH, (EXAMPLES / "vllm-caller.yml").read_text())
    _write(dest, ".github/workflows/moegate-verdict.yml", (EXAMPLES / "vllm-verdict.yml").read_text())
    _write(dest, POLICY_PATH, (EXAMPLES / "moegate-policy.yml").read_text())
    _write(dest, DOCS_FILE, "# Using vLLM\n")
    _write(dest, MOE_FILE, "# the fused-MoE layer (a stand-in)\n")
    _write(dest, "vllm/attention/layer.py", "# attention (a stand-in)\n")
    for rel, text in compiled_tree.tree().items():  # the compiled sources and their CMake lists, the wheel's build
        _write(dest, rel, text)
    _commit(dest, "vLLM main (stand-in)")
    _git(dest, "checkout", "-q", "-b", "broken-main")
    _break_policy(dest)
    _commit(dest, "a policy with an unknown key")
    _git(dest, "checkout", "-q", "-b", NO_REBUILD_MAIN, "main")
    _no_rebuild(dest)
    _commit(dest, "the caller's runners cannot build the MoE ops: REBUILD_MOE false")
    heads: Heads = {}
    for case in CASES:
        _git(dest, "checkout", "-q", "-b", case.name, case.base)
        case.edit(dest)
        heads[case.name] = [_commit(dest, case.name)]
        if case.label == "earlier":
            _touch_docs(dest)
            heads[case.name].append(_commit(dest, f"{case.name}: a push after the label"))
    _git(dest, "checkout", "-q", "main")
    return heads


def changes_outputs(repo: Path, case: Case, head: str, moe_list: Path = LIST) -> dict[str, str]:
    """The caller's ``changes`` job's outputs, computed as it computes them (the replay runs the job itself)."""
    merge_base = _git(repo, "merge-base", case.base, head)
    changed = _git(repo, "diff", "--name-only", "--no-renames", merge_base, head).splitlines()
    tiers = "dispatch,kernels,e2e,ab" if reaching(changed, read_list(moe_list)) else "dispatch"
    return {"tiers": tiers, "promise": "equivalent" if case.label else "identical"}


def wheels_conclusion(repo: Path, case: Case, head: str) -> str:
    """The caller's ``wheels`` job's conclusion as its changes step decides it (the replay runs the job itself):
    failure where a compiled source of the MoE ops changed and the caller does not rebuild them."""
    env = (caller_at(repo, head).get("jobs") or {}).get("wheels", {}).get("env") or {}
    rebuilt = ["_moe_C_stable_libtorch"] if str(env.get("REBUILD_MOE", "true")) == "true" else []
    return "failure" if compiled_changes(repo, case.base, head).unbuilt(rebuilt) else "success"


def _resolve(value: Any, outputs: dict[str, str]) -> str:
    m = MOEGATE_NEEDS.match(str(value))
    if m:
        return outputs[m.group(1)]
    if "${{" in str(value):
        raise ValueError(f"the replay resolves needs.changes.outputs only, not {value!r}")
    return str(value).lower() if isinstance(value, bool) else str(value)


def run_jobs(
    caller: dict[str, Any], outputs: dict[str, str], concluded: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The run's jobs as GitHub's API lists them: the caller's own, and moegate.yml's under the calling job's name.

    ``concluded``: the caller's own jobs' conclusions where the replay ran them (the rest succeeded). Where a job the
    reusable call needs did not succeed, the call is skipped and listed as one job of its own name, as GitHub lists a
    skipped call (its workflow's jobs never exist)."""
    concluded = concluded or {}
    jobs: list[dict[str, Any]] = []
    url = f"https://github.com/{REPO}/actions/runs/{RUN_ID}/job/"
    for job_id, job in (caller.get("jobs") or {}).items():
        if "uses" not in job:
            runs_on = job.get("runs-on", "ubuntu-24.04")
            labels = [runs_on] if isinstance(runs_on, str) else list(runs_on)
            jobs.append({"name": str(job.get("name", job_id)), "conclusion": concluded.get(job_id, "success"),
                         "labels": labels})  # fmt: skip
            continue
        needs = [job["needs"]] if isinstance(job.get("needs"), str) else list(job.get("needs") or [])
        if any(concluded.get(n, "success") != "success" for n in needs):
            jobs.append({"name": str(job.get("name", job_id)), "conclusion": "skipped", "labels": []})
            continue
        given = {k: _resolve(v, outputs) for k, v in (job.get("with") or {}).items()}
        prefix = f"{job.get('name', job_id)} / "
        labels = ["self-hosted", "linux", "x64", "gpu", given.get("gpu-runner-label", "rtx4090")]
        out = plan(given.get("tiers", "dispatch,kernels,e2e"), "0.32.0", "0.33.0", given.get("models", "random,trained"),
                   promise=given.get("promise", "identical"), ab_gate=given.get("ab-gate", "true") == "true",
                   ab_gate_threshold=float(given.get("ab-gate-threshold", 0.03)),
                   min_kernel_tests=int(given.get("min-kernel-tests", 40)))  # fmt: skip
        names = ["plan (inputs checked before any install)"]
        names += ["dispatch tier (CPU, PR build)"] if out["run-dispatch"] == "true" else []
        names += ["meta-check (CPU, base must fail)"] if out["run-meta"] == "true" else []
        jobs += [{"name": prefix + n, "conclusion": "success", "labels": ["ubuntu-24.04"]} for n in names]
        for leg in json.loads(out["gpu-matrix"])["include"]:
            jobs.append({"name": f"{prefix}gpu {leg['leg']}: {leg['says']}", "conclusion": "success", "labels": labels})
        jobs.append({"name": prefix + "moegate verdict", "conclusion": "success", "labels": ["ubuntu-24.04"]})
    for i, job in enumerate(jobs):
        job["html_url"] = f"{url}{9000 + i}"
    return jobs


def _referenced(caller: dict[str, Any]) -> list[dict[str, str]]:
    refs = []
    for job in (caller.get("jobs") or {}).values():
        if "uses" in job:
            path, _, ref = str(job["uses"]).partition("@")
            refs.append(
                {"path": f"{path}@{ref}", "sha": ref if re.fullmatch(r"[0-9a-f]{40}", ref) else OTHER_REF, "ref": ref}
            )
    return refs


def _pr(case: Case, head: str) -> dict[str, Any]:
    head_repo = {"full_name": REPO, "owner": {"login": REPO.split("/")[0]}}
    labels = [{"name": "moegate-equivalent"}] if case.label else []
    return {"number": 7, "labels": labels, "head": {"ref": case.name, "sha": head, "repo": head_repo},
            "base": {"ref": case.base, "repo": head_repo}}  # fmt: skip


def caller_at(repo: Path, sha: str) -> dict[str, Any]:
    return yaml.safe_load(_git(repo, "show", f"{sha}:{CALLER_PATH}")) or {}


def scenario(
    repo: Path, case: Case, heads: list[str], outputs: dict[str, str], concluded: Mapping[str, str] | None = None
) -> Scenario:
    """What GitHub holds for the case's run; the caller's runs start at 10:00 with one a push, the label after them."""
    caller = caller_at(repo, heads[-1])
    head_repo = {"full_name": REPO}
    runs = [{"head_sha": sha, "created_at": f"2026-12-06T10:0{i}:00Z", "head_repository": head_repo}
            for i, sha in enumerate(heads)]  # fmt: skip
    at = {"head": "2026-12-06T10:05:00Z", "earlier": "2026-12-06T10:00:30Z", "early": "2026-12-06T09:00:00Z"}
    events = []
    if case.label:
        events = [{"event": "labeled", "label": {"name": "moegate-equivalent"}, "actor": {"login": case.labeller},
                   "created_at": at[case.label]}]  # fmt: skip
    jobs = run_jobs(caller, outputs, concluded)
    return Scenario(REPO, repo, _pr(case, heads[-1]), jobs, events, dict(PERMISSIONS), runs)


def workflow_run_event(repo: Path, case: Case, head: str, conclusion: str = "success") -> dict[str, Any]:
    caller = caller_at(repo, head)
    pr = _pr(case, head)
    repository = {"full_name": REPO, "name": "vllm", "owner": {"login": REPO.split("/")[0]}}
    run = {
        "id": RUN_ID, "run_attempt": 1, "name": "moegate", "event": "pull_request", "status": "completed",
        "conclusion": conclusion, "path": CALLER_PATH, "head_sha": head, "head_branch": case.name,
        "head_repository": repository, "html_url": f"https://github.com/{REPO}/actions/runs/{RUN_ID}",
        "pull_requests": [{"number": pr["number"], "head": {"ref": case.name, "sha": head},
                           "base": {"ref": case.base}}],
        "referenced_workflows": _referenced(caller),
    }  # fmt: skip
    return {"action": "completed", "workflow_run": run, "repository": repository}
