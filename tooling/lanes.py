"""The test command's sessions in parallel lanes: ``nox -s tests`` (``python -m tooling.lanes``).

``nox -t tests`` runs the tagged sessions one after another. Most of them are
single-threaded (pytest, a server's start-up imports), so on a 2-core machine two lanes
finish in about the time of the longest lane instead of the sum. Each session still runs
as ``nox -s NAME`` in its own process, exactly as a user runs it; the environments it
builds are locked (``tooling/nox_envs.py``), so two lanes never build the same one.

Sessions go to lanes longest first, each to the lane that is free soonest (LPT), by the
durations this machine measured last time (``<env root>/lane-times.json``, falling back
to ``EXPECTED_S``). A session's output is printed whole when it ends (lanes never
interleave lines), then one line per session and the totals of every pytest run:
``tests: N passed, N failed, N skipped``. Exit 1 when any session failed.

    python -m tooling.lanes [--lanes N] [--tag tests] [--list] [SESSION ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

EXPECTED_S = {
    "e2e-smoke": 300.0,
    "unit-shard(1)": 215.0,
    "unit-shard(2)": 215.0,
    "ab-smoke": 200.0,
    "unit(3.11)": 420.0,
    "unit(3.12)": 420.0,
    "meta-base-fails": 60.0,
    "dispatch-0.33.0": 50.0,
    "lint": 25.0,
    "wheel-check": 15.0,
}
"""Seconds each session took on the 2-core machine (results/ci-time.md, run 22 and "The unit tier in two shards");
a session not named here counts 60 s."""

_PYTEST_TOTALS = re.compile(r"^=+ (?P<body>.*\d+ (?:passed|failed|skipped|error|errors).*) in [\d.]+s.* =+$")
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


@dataclass
class Outcome:
    session: str
    lane: int
    code: int
    seconds: float
    log: str

    @property
    def passed(self) -> bool:
        return self.code == 0


def pytest_totals(log: str) -> dict[str, int]:
    """The counts of every pytest closing line in ``log`` (``error`` and ``errors`` together)."""
    totals: dict[str, int] = {}
    for line in log.splitlines():
        m = _PYTEST_TOTALS.match(line.strip())
        if not m:
            continue
        for n, kind in _COUNT.findall(m.group("body")):
            kind = "errors" if kind.startswith("error") else kind
            totals[kind] = totals.get(kind, 0) + int(n)
    return totals


def plan(sessions: Sequence[str], lanes: int, durations: Mapping[str, float]) -> list[list[str]]:
    """Longest processing time first: each session, longest first, to the lane with the least work.

    The two server smokes may share the machine: with 1 GiB of KV cache each (``serving.CPU_SERVER_ENV``) their
    servers, five at most at once, fit its memory (results/ci-time.md)."""
    lanes = max(1, min(lanes, len(sessions) or 1))
    out: list[list[str]] = [[] for _ in range(lanes)]
    load = [0.0] * lanes
    for name in sorted(sessions, key=lambda s: (-durations.get(s, 60.0), sessions.index(s))):
        i = min(range(lanes), key=lambda k: (load[k], k))
        out[i].append(name)
        load[i] += durations.get(name, 60.0)
    return out


def tagged_sessions(tag: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "--json", "-t", tag], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"tooling.lanes: nox -l -t {tag} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return [entry["session"] for entry in json.loads(proc.stdout)]


def times_file() -> Path:
    from tooling.nox_envs import env_root

    return env_root() / "lane-times.json"


def load_times(path: Path) -> dict[str, float]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return dict(EXPECTED_S)
    if not isinstance(raw, dict):
        return dict(EXPECTED_S)
    return {**EXPECTED_S, **{k: float(v) for k, v in raw.items() if isinstance(v, (int, float))}}


def recorded_times(before: Mapping[str, float], outcomes: Sequence[Outcome]) -> dict[str, float]:
    """The times the next plan reads: a passed session's own; a failed one's only where longer than the time before.

    A failed session may have stopped early, so its time can understate it; but the time before may be a default far
    below it: the unit tier, failed once in 466 s, was planned next at ``EXPECTED_S``'s 70 s, in the lane of every
    small session (results/ci-time.md, runs 21 and 22: 577 s)."""
    out = dict(before)
    for o in outcomes:
        if o.passed or o.seconds > out.get(o.session, 0.0):
            out[o.session] = round(o.seconds, 1)
    return out


def _run_lane(index: int, names: list[str], outcomes: list[Outcome], lock: threading.Lock) -> None:
    for name in names:
        with lock:
            print(f"lane {index + 1}: {name} started", flush=True)
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "nox", "-s", name, "--no-color"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        out = Outcome(name, index, proc.returncode, time.monotonic() - t0, proc.stdout)
        with lock:
            outcomes.append(out)
            verdict = "passed" if out.passed else f"FAILED (exit {out.code})"
            print(f"\n===== lane {index + 1}: {name}: {verdict} in {out.seconds:.0f} s =====", flush=True)
            print(out.log.rstrip(), flush=True)


def run(lanes_plan: list[list[str]]) -> list[Outcome]:
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_run_lane, args=(i, names, outcomes, lock), daemon=True)
        for i, names in enumerate(lanes_plan)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def summary(outcomes: Sequence[Outcome], wall_s: float) -> tuple[str, bool]:
    lines = ["", "===== tests: every session ====="]
    for o in sorted(outcomes, key=lambda o: (o.lane, o.session)):
        lines.append(f"lane {o.lane + 1}  {'ok    ' if o.passed else 'FAILED'}  {o.seconds:6.0f} s  {o.session}")
    totals: dict[str, int] = {}
    for o in outcomes:
        for k, v in pytest_totals(o.log).items():
            totals[k] = totals.get(k, 0) + v
    ok = all(o.passed for o in outcomes)
    lines.append(f"wall time {wall_s:.0f} s in {len({o.lane for o in outcomes})} lanes")
    extra = "".join(f", {totals[k]} {k}" for k in ("skipped", "errors") if totals.get(k))
    lines.append(f"tests: {totals.get('passed', 0)} passed, {totals.get('failed', 0)} failed{extra}")
    return "\n".join(lines), ok


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.lanes", description=__doc__.split("\n\n")[0])
    ap.add_argument("sessions", nargs="*", help="sessions to run (default: every session tagged --tag)")
    ap.add_argument("--lanes", type=int, default=2, help="sessions at once (default 2; 1 = nox -t tests)")
    ap.add_argument("--tag", default="tests")
    ap.add_argument("--list", action="store_true", help="print the plan and exit")
    args = ap.parse_args(argv)
    if args.lanes < 1:
        print(f"tooling.lanes: --lanes must be >= 1, got {args.lanes}", file=sys.stderr)
        return 2
    sessions = list(args.sessions) or tagged_sessions(args.tag)
    path = times_file()
    durations = load_times(path)
    lanes_plan = plan(sessions, args.lanes, durations)
    for i, names in enumerate(lanes_plan):
        expect = sum(durations.get(n, 60.0) for n in names)
        print(f"lane {i + 1} (about {expect:.0f} s): {', '.join(names)}", flush=True)
    if args.list:
        return 0
    t0 = time.monotonic()
    outcomes = run(lanes_plan)
    text, ok = summary(outcomes, time.monotonic() - t0)
    print(text, flush=True)
    measured = recorded_times(durations, outcomes)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(measured, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    except OSError:
        pass  # the plan falls back to EXPECTED_S next time
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
