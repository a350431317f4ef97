"""Run the real-bug corpus: each re-planted bug's build through ``moegate gate``, some side by side, within a budget.

For every bug (and first for the unplanted build, the baseline, which must pass or no score means
anything) this makes an overlay with the bug re-planted (``moegate.power.corpus.plant``; the baseline's
overlay is the same mirror without an edit), a build that sees it first (``moegate.builds.planted.make_build``: the interpreter, then ``--site`` directories such
as the GPU machine's unpacked vLLM), checks the build imports vLLM from the overlay, and runs

    BUILD -m moegate gate --vllm-python BUILD --tiers TIERS --junit OUT/ID/gate.xml -- -p moegate.power.corpus_stop

from the checkout with ``MOEGATE_PROFILE=ci``, as the kernels leg runs the gate
(``tooling/ci/gpu_leg.py``), except that the run ends at its first failing behaviour test
(``moegate.power.corpus_stop``; ``--full`` runs every test). With the ``diff`` tier, a stopping gate is two
``moegate gate`` runs on one log: the pytest tiers, then ``--tiers diff`` only where they failed no behaviour test
(a bug they killed is killed whatever the diff says, and the diff's two builds take minutes). At most ``--jobs`` gates run at once;
none starts with less than ``--min-start-s`` of ``--budget-s`` left, and each is cut (its process
group stopped) before the budget ends. Each bug's result goes to ``OUT/ID/result.json`` with its log
and JUnit report; ``OUT/summary.json`` holds them all and ``OUT/summary.md`` renders them
(``moegate.power.corpus_report``). The installed files are only read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from moegate.builds.planted import BuildError, make_build
from moegate.core import junit
from moegate.core.faults import EXIT_STATUS
from moegate.core.golden_files import atomic_write
from moegate.core.hashing import sha256_file
from moegate.paths import ROOT
from moegate.power.corpus import CORPUS, Bug, CorpusError, plant
from moegate.power.corpus_report import render
from moegate.power.corpus_stop import is_review
from moegate.power.overlay import clean_stale_workdirs, make_workdir
from moegate.power.run import probe_package_dir
from moegate.serve.processes import stop_group

BASELINE = "baseline"
STOP_PLUGIN = "moegate.power.corpus_stop"
MARGIN_S = 20.0
"""Seconds kept back from the budget for stopping a gate's processes and writing the summary."""


@dataclass
class Failure:
    nodeid: str
    tier: str  # dispatch | kernels | other
    review: bool  # a review check (moegate.power.corpus_stop.REVIEW_TESTS), not behaviour
    message: str


@dataclass
class GateResult:
    """One build through the gate: the bug (or the baseline) and what the gate said."""

    id: str
    status: str  # ran | timeout | error | not-run
    exit_code: int | None = None
    wall_s: float = 0.0
    tests: int = 0
    failures: list[Failure] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)  # "nodeid: reason" of skipped tests (a survivor's evidence)
    error: str = ""  # why a build or a gate did not run to a verdict
    planted: list[str] = field(default_factory=list)  # files of the vllm package the re-plant edits
    fingerprint: str = ""  # the re-plant's (moegate.power.corpus.Bug.fingerprint): the page refuses a stale one
    log: str = ""  # the gate's log, relative to the run's output folder


def tier_of(nodeid: str) -> str:
    for tier in ("dispatch", "kernels"):
        if nodeid.startswith(f"tests/{tier}/"):
            return tier
    return "other"


def read_junit(path: Path) -> tuple[int, list[Failure], list[str]]:
    """(testcases, failures and errors in run order, skips) of a JUnit report; ``OSError``/``ParseError`` if none."""
    root = ET.parse(path).getroot()
    tests, failures, skips = 0, [], []
    for case in root.iter("testcase"):
        tests += 1
        nodeid = junit.nodeid(case)
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            first = ((bad.get("message") or bad.text or "").strip().splitlines() or [""])[0]
            failures.append(Failure(nodeid, tier_of(nodeid), is_review(nodeid), first[:300]))
            continue
        skip = case.find("skipped")
        if skip is not None:
            skips.append(f"{nodeid}: {(skip.get('message') or '').strip()[:200]}")
    return tests, failures, skips


def gate_command(
    build_python: str, tiers: str, junit: Path, label: str, full: bool, base_python: str | None = None
) -> list[str]:
    """The gate a bug's build runs; with the ``diff`` tier, against ``base_python`` (the baseline's build: the
    unedited mirror), as the kernels leg runs a PR against its base."""
    cmd = [build_python, "-m", "moegate", "gate", f"--vllm-python={build_python}", f"--tiers={tiers}"]
    if "diff" in tiers.split(","):
        if base_python is None:
            raise CorpusError(f"--tiers {tiers}: the diff tier needs the baseline's build as its base")
        cmd += [f"--base-python={base_python}"]
    folder = junit.parent  # the bug's own: gates side by side must not write one reports/ page
    cmd += [f"--label={label}", f"--junit={junit}", f"--page={folder / 'gate.md'}"]
    cmd += [f"--diff-json={folder / 'diff.json'}", "--", "-q", "-p", "no:cacheprovider"]
    return cmd if full else [*cmd, "-p", STOP_PLUGIN]


def gate_steps(tiers: str, full: bool) -> list[str]:
    """The ``--tiers`` of each ``moegate gate`` run a build gets: one run of them all, or, for a gate that stops at
    its first kill, the pytest tiers and then ``diff`` alone (run only where the first killed nothing)."""
    names = tiers.split(",")
    if full or "diff" not in names or names == ["diff"]:
        return [tiers]
    return [",".join(t for t in names if t != "diff"), "diff"]


def _killed(junit: Path) -> bool:
    """Whether the JUnit report names a failing behaviour test (a review check's failure is no kill)."""
    try:
        return any(not f.review for f in read_junit(junit)[1])
    except (OSError, ET.ParseError):
        return False


def _append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)


@dataclass
class Plan:
    """What one corpus run does (the command line, resolved)."""

    vllm_python: str
    sites: tuple[str, ...]
    tiers: str
    out: Path
    jobs: int = 1
    budget_s: float = 3600.0
    timeout_s: float = 1800.0
    min_start_s: float = 120.0
    full: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    corpus: Path = CORPUS
    command: str = ""


class Runner:
    """Runs a plan's gates; ``stop_all`` ends every gate still running (an interrupt, the budget)."""

    def __init__(self, plan: Plan, work: Path, package_dir: Path, version: str = "?") -> None:
        self.plan, self.work, self.package_dir, self.version = plan, work, package_dir, version
        self.t0 = time.monotonic()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def left_s(self) -> float:
        return self.plan.budget_s - (time.monotonic() - self.t0)

    def build(self, bug: Bug | None) -> tuple[str, list[str]]:
        """The build for ``bug`` (None: the baseline) and the files planted; ``CorpusError`` or ``BuildError``."""
        name = bug.id if bug else BASELINE
        overlay = plant(bug, self.package_dir, self.work / name / "overlay")
        sites = [str(overlay), *self.plan.sites]
        python = str(make_build(self.work / name / "build", self.plan.vllm_python, sites=sites))
        found, _ = probe_package_dir(python)
        want = overlay / self.package_dir.name
        if found != want:
            raise BuildError(f"the build imports vllm from {found}, not its overlay {want}")
        return python, list(bug.files) if bug else []

    def gate(self, bug: Bug | None) -> GateResult:
        name = bug.id if bug else BASELINE
        folder = self.plan.out / name
        folder.mkdir(parents=True, exist_ok=True)
        result = GateResult(name, "error", log=f"{name}/gate.log", fingerprint=bug.fingerprint if bug else "")
        t0 = time.monotonic()
        try:
            python, result.planted = self.build(bug)
        except (CorpusError, BuildError, OSError) as exc:
            result.error = f"no build: {exc}"
            return result
        limit = min(self.plan.timeout_s, self.left_s() - MARGIN_S)
        deadline = time.monotonic() + limit
        junit = folder / "gate.xml"
        junit.unlink(missing_ok=True)
        base = str(self.work / BASELINE / "build" / "bin" / "python")  # built first: the baseline runs before any bug
        # the baseline runs every test: its failures are what a bug's first failing test is held against
        # (corpus_report.verdict's "not judged"), and a stop at its first one would leave the later ones unknown
        full = self.plan.full or bug is None
        label = f"vLLM {self.version} + {name}"
        env = {**os.environ, **self.plan.env, "MOEGATE_PROFILE": "ci", "MOEGATE_REQUIRE_VLLM": "1"}
        env.pop("PYTEST_ADDOPTS", None)
        log = folder / "gate.log"
        log.unlink(missing_ok=True)
        said = ""
        for step in gate_steps(self.plan.tiers, full):
            if step == "diff" and _killed(junit):
                _append(log, "diff: not run, a behaviour test failed above (the bug is killed without it)\n")
                break
            cmd = gate_command(python, step, junit, label, full, base)
            code = self._run(name, cmd, env, log, deadline)
            if code is None:
                result.status, result.error = "timeout", f"cut after {limit:.0f} s (--timeout-s or the budget)"
                break
            result.status = "ran"
            if code != 0 or result.exit_code in (None, 0):  # the diff's verdict where it failed, else the first's
                result.exit_code, said = code, verdict_line(log)
        result.wall_s = round(time.monotonic() - t0, 1)
        try:
            result.tests, result.failures, result.skips = read_junit(junit)
        except (OSError, ET.ParseError) as exc:
            if result.status == "ran" and result.exit_code not in (0, 1):
                result.status, result.error = "error", f"gate exit {result.exit_code}, no JUnit report ({exc})"
        if result.status == "ran" and result.exit_code == 2:
            result.status, result.error = "error", "gate exit 2 (bad input): see the log"
        elif result.status == "ran" and result.exit_code != 0:
            result.error = said
        return result

    def _run(self, name: str, cmd: list[str], env: Mapping[str, str], log: Path, deadline: float) -> int | None:
        """One ``moegate gate`` run appended to ``log``: its exit status, or None where the deadline cut it."""
        with log.open("ab") as fh:
            fh.write((" ".join(cmd) + "\n").encode())
            fh.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
            with self._lock:
                self._procs[name] = proc
            try:
                return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop_group(proc)
                return None
            finally:
                with self._lock:
                    self._procs.pop(name, None)

    def stop_all(self) -> None:
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            stop_group(proc, grace_s=5.0)


VERDICT_PREFIXES = tuple(f"moegate gate: {v}: " for v in EXIT_STATUS)
"""How the gate's verdict line starts (``moegate gate: FAIL: LABEL: ...``); its other lines (the page's path) do not."""


def verdict_line(log: Path) -> str:
    """The gate's last line naming its verdict (a FAIL without a failing test: vLLM does not import, the floor, the
    diff tier). Not the gate's last line: the page's path comes after it (the 2026-12-06 H100 corpus read that one)."""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "no log"
    return next((ln.strip() for ln in reversed(lines) if ln.startswith(VERDICT_PREFIXES)), "no verdict line in the log")


def _rev() -> str:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() or "unknown"


def _device(python: str) -> str:
    code = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu (no CUDA GPU)')"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False, timeout=300)
    return (proc.stdout.strip().splitlines() or ["unknown"])[-1]


def run(
    plan: Plan, bugs: Sequence[Bug], log: Callable[[str], object] = lambda m: print(m, file=sys.stderr, flush=True)
) -> dict[str, Any]:
    """Every bug's gate (the baseline first) within the plan's budget; returns the summary it writes."""
    plan.out.mkdir(parents=True, exist_ok=True)
    corpus_sha256 = sha256_file(plan.corpus)  # the file the bugs were read from, before any gate runs
    clean_stale_workdirs()
    work = make_workdir()
    results: dict[str, GateResult] = {}
    try:
        probe_build = make_build(work / "probe", plan.vllm_python, sites=plan.sites)
        package_dir, version = probe_package_dir(str(probe_build))
        device = _device(str(probe_build))
        log(f"corpus: vLLM {version} at {package_dir}, {device}; {len(bugs)} bugs, tiers {plan.tiers}, "
            f"{plan.jobs} at a time, budget {plan.budget_s:.0f} s")  # fmt: skip
        runner = Runner(plan, work, package_dir, version)
        # the longest first: the baseline and the expected survivors run the whole gate, a kill stops at its test
        queue: list[Bug | None] = [None, *sorted(bugs, key=lambda b: b.expect != "survives")]
        running: dict[Future[GateResult], str] = {}
        with ThreadPoolExecutor(max_workers=plan.jobs) as pool:
            try:
                while queue or running:
                    while queue and len(running) < plan.jobs:
                        if runner.left_s() - MARGIN_S < plan.min_start_s:
                            for b in queue:
                                name = b.id if b else BASELINE
                                results[name] = GateResult(
                                    name, "not-run", error="the budget ran out before it started"
                                )
                            queue.clear()
                            break
                        bug = queue.pop(0)
                        name = bug.id if bug else BASELINE
                        log(f"corpus: {name}: started ({runner.left_s():.0f} s of the budget left)")
                        running[pool.submit(runner.gate, bug)] = name
                    if not running:
                        break
                    done, _ = wait(list(running), return_when=FIRST_COMPLETED)
                    for fut in done:
                        name = running.pop(fut)
                        res = fut.result()
                        results[name] = res
                        atomic_write(plan.out / name / "result.json", json.dumps(asdict(res), indent=1) + "\n")
                        log(f"corpus: {name}: {_one_line(res)} in {res.wall_s:.0f} s")
            except BaseException:
                runner.stop_all()
                raise
        order = [BASELINE, *(b.id for b in bugs)]
        summary = {
            "command": plan.command,
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "project_rev": _rev(),
            "vllm_version": version,
            "device": device,
            "tiers": plan.tiers,
            "jobs": plan.jobs,
            "budget_s": plan.budget_s,
            "stop_at_first_kill": not plan.full,
            "wall_s": round(time.monotonic() - runner.t0, 1),
            "corpus": str(plan.corpus.relative_to(ROOT)) if plan.corpus.is_relative_to(ROOT) else str(plan.corpus),
            "corpus_sha256": corpus_sha256,
            "results": [asdict(results[n]) for n in order if n in results],
        }
        atomic_write(plan.out / "summary.json", json.dumps(summary, indent=1) + "\n")
        atomic_write(plan.out / "summary.md", render([summary], bugs))
        return summary
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _one_line(res: GateResult) -> str:
    if res.status != "ran":
        return f"{res.status}: {res.error}"
    behaviour = [f for f in res.failures if not f.review]
    if behaviour:
        return f"gate exit {res.exit_code}, first failing behaviour test {behaviour[0].nodeid}"
    if res.failures:
        return f"gate exit {res.exit_code}, review checks only: {', '.join(f.nodeid for f in res.failures)}"
    return f"gate exit {res.exit_code}, no failing test ({res.tests} tests)"
