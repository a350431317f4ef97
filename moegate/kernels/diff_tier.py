"""``moegate diff``: the differential kernel tier, base against PR on one GPU.

    moegate diff --base-python B --pr-python P [--promise identical|equivalent] [--cases N] [--seed S]
        [--runs R] [--budget-s T] [--json FILE]
    moegate diff --base-python B --pr-python P --entrypoint legacy|modular --case JSON    one case: the reproducer

A build is an interpreter. One kernel worker (``moegate.kernels.workers``) runs in each build's interpreter
(``moegate.kernels.interpreters``), both on the one GPU, sharing Triton's disk cache, each with its own weight
bank; this process draws the cases once (the kernel sweep's strategies, one seeded Hypothesis run) and feeds every
case to both. Each worker runs the kernel tier's own check (``run_checked``) and sends back the output, the path and
a digest of every input; the base's also sends the fp32 torch reference (``moegate.kernels.runner.DiffRunner``).
Here both outputs are compared with that one reference and judged (``moegate.kernels.differential``: the promise,
the nondeterministic paths, the paired tests and their false-FAIL rate).

``--runs R`` judges R runs in one start-up (seeds S, S+1, ...), each on its own cases, for measuring the
tier's false-FAIL rate and power (``lab/gpu/diff.sh``); no run starts once the last one's time would pass
``--budget-s``, and a worker runs no case past it (a run cut short is judged on what it paired, and is not a PASS
when that is less than half of what it drew). Every run is judged under both promises (the JSON has both); the
exit status and the printed verdict are ``--promise``'s.

Not judged (one line, exit 2), never a PASS: the two interpreters are different Pythons (major.minor), their torch
sees different GPUs or none, the base build cannot run the tier's cases (its vLLM does not import, lacks the
entrypoints, or raises on a case), or the builds drew different inputs from the same seeds. A PR build that cannot
run them, or raises on a case the base runs, FAILs (exit 1). ``moegate gate --tiers ...,diff`` runs this command
and FAILs when it exits other than 0, so a requested tier that was not judged is a red gate.

Exit status: 0 PASS (every run), 1 FAIL, 2 not judged or bad input.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegate.core.case import ENTRYPOINTS, MoECase
from moegate.core.golden_files import atomic_write
from moegate.kernels.differential import MIN_RATIO, PROMISES, NotComparable, Outcome, Verdict, judge, outcome
from moegate.kernels.interpreters import InterpreterError
from moegate.kernels.paired import ALPHA, is_worse
from moegate.kernels.resources import triton_cache_dir
from moegate.kernels.runner import DiffRunner, Runner
from moegate.kernels.sweep import draw_cases
from moegate.kernels.workers import Options, Pool, WorkerFailed
from moegate.strategies.kernels import kernel_cases

PREFIX = "moegate diff"
DEFAULT_CASES = 300
"""Cases a run draws: the ``ci`` gate's, about two minutes on an H200 from a cold Triton cache (docs/kernels.md)."""


class NotJudged(RuntimeError):
    """The tier cannot judge these builds (one line): exit 2."""


class PrFailed(RuntimeError):
    """The PR build cannot run what the base runs (one line and its error): exit 1."""


@dataclass
class Submitted:
    run: int
    index: int
    case: MoECase
    entrypoint: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.entrypoint, self.case.to_json())


class Pairing:
    """Each build's payloads matched to the cases as submitted, and an ``Outcome`` once both have arrived.

    One worker a build takes the cases in the order they were queued; one it skips (past the budget) sends
    nothing, so a payload belongs to the next submitted case with its key.
    """

    def __init__(self) -> None:
        self.submitted: list[Submitted] = []
        self._next = {"base": 0, "pr": 0}
        self._halves: dict[int, dict[str, dict[str, Any]]] = {}
        self.outcomes: dict[int, list[Outcome]] = {}

    def submit(self, run: int, index: int, case: MoECase, entrypoint: str) -> None:
        self.submitted.append(Submitted(run, index, case, entrypoint))

    def add(self, side: str, payload: dict[str, Any]) -> None:
        key, pos = tuple(payload["key"]), self._next[side]
        while pos < len(self.submitted) and self.submitted[pos].key != key:
            pos += 1
        if pos == len(self.submitted):
            raise RuntimeError(f"the {side} build sent a case that was never submitted: {key}")
        self._next[side] = pos + 1
        halves = self._halves.setdefault(pos, {})
        halves[side] = payload
        if len(halves) == 2:
            s = self.submitted[pos]
            o = outcome(s.run, s.index, s.case, s.entrypoint, halves["base"], halves["pr"])
            self.outcomes.setdefault(s.run, []).append(o)
            del self._halves[pos]


def python_version(python: str) -> str:
    """``python``'s major.minor; ``NotJudged`` where it does not run."""
    try:
        proc = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
    except OSError as exc:
        raise NotJudged(f"{python}: cannot run it ({exc.strerror or exc})") from None
    if proc.returncode != 0:
        raise NotJudged(f"{python}: exits {proc.returncode} before any case")
    return proc.stdout.strip()


def comparable(base: dict[str, Any], pr: dict[str, Any]) -> str | None:
    """Why two started workers' builds cannot be compared (one line), or None."""
    for key, what in (("python", "Python"), ("device", "GPU")):
        b, p = base.get(key), pr.get(key)
        if key == "python":
            b, p = ".".join(str(b).split(".")[:2]), ".".join(str(p).split(".")[:2])
        if b != p:
            return f"the base build runs {what} {b} and the PR build {what} {p}: the tier compares builds on one {what}"
    return None


def _started(pool: Pool, side: str, python: str) -> dict[str, Any]:
    try:
        info: dict[str, Any] = pool.wait_ready()[0]
    except WorkerFailed as exc:
        line = f"the {side} build ({python}) cannot run the tier's cases: {exc}"
        raise (NotJudged(line) if side == "base" else PrFailed(line)) from None
    return info


def _finished(pool: Pool, side: str) -> None:
    try:
        pool.finish()
    except WorkerFailed as exc:
        text = "\n".join(exc.errors.values())
        line = f"the {side} build raised on a case: {exc}\n{text}"
        raise (NotJudged(line) if side == "base" else PrFailed(line)) from None


@dataclass
class Runs:
    """What one start-up of both builds ran: each run's outcomes, its seed, its cases drawn and its seconds."""

    info: dict[str, dict[str, Any]]
    seeds: list[int]
    drawn: list[int]
    seconds: list[float]
    outcomes: dict[int, list[Outcome]]


def run_builds(
    base: str, pr: str, cases: list[tuple[MoECase, str]] | None, *, n: int, seed: int, runs: int, budget_s: float,
    say: Callable[[str], None], runner: Callable[..., Runner] | None = None,
) -> Runs:  # fmt: skip
    """Start both builds, feed them the same cases (``cases``, or ``runs`` draws of ``n`` from ``seed`` on), pair.

    ``runner(reference=...)`` is what each worker runs, ``DiffRunner`` by default (a module-level callable: the unit
    tier passes a stand-in).
    """
    runner = runner or DiffRunner
    pythons = {"base": python_version(base), "pr": python_version(pr)}
    if pythons["base"] != pythons["pr"]:
        raise NotJudged(
            f"the base build runs Python {pythons['base']} and the PR build Python {pythons['pr']}: "
            "the tier compares builds of one Python"
        )
    cache, _ = triton_cache_dir(None, os.environ)
    os.environ["TRITON_CACHE_DIR"] = str(cache)  # both builds' workers inherit it: one cache
    threads = max(1, (os.cpu_count() or 2) // 2)
    options = Options(budget_s, False, 0, threads)
    pairing = Pairing()
    result = Runs({}, [], [], [], pairing.outcomes)
    base_pool = Pool(1, functools.partial(runner, reference=True), options, python=base)
    pr_pool = Pool(1, functools.partial(runner, reference=False), options, python=pr)
    with base_pool, pr_pool:
        try:
            base_pool.launch()
            pr_pool.launch()
        except InterpreterError as exc:
            raise NotJudged(str(exc)) from None
        result.info = {"base": _started(base_pool, "base", base), "pr": _started(pr_pool, "pr", pr)}
        reason = comparable(result.info["base"], result.info["pr"])
        if reason:
            raise NotJudged(reason)
        base_pool.on_payload = functools.partial(pairing.add, "base")
        pr_pool.on_payload = functools.partial(pairing.add, "pr")
        fp8 = all(i.get("fp8") for i in result.info.values())
        strategies = {
            ep: kernel_cases(ep, expert_map=None, quant=None, schemes=None if fp8 else "wna16") for ep in ENTRYPOINTS
        }
        start = time.perf_counter()
        base_pool.release()
        pr_pool.release()
        for run in range(1 if cases is not None else runs):
            began = time.perf_counter()
            if run and began - start + result.seconds[-1] > budget_s:
                say(f"{run} runs in {began - start:.0f} s: another would pass --budget-s {budget_s:g}")
                break
            counter = iter(range(1 << 30))

            def sink(case: MoECase, entrypoint: str, run: int = run, counter: Any = counter) -> None:
                pairing.submit(run, next(counter), case, entrypoint)
                base_pool.submit(case, entrypoint)
                pr_pool.submit(case, entrypoint)

            if cases is not None:
                for case, entrypoint in cases:
                    sink(case, entrypoint)
            else:
                draw_cases(n, seed + run, strategies, sink)
            result.seeds.append(seed + run)
            result.drawn.append(len(cases) if cases is not None else n)
            result.seconds.append(time.perf_counter() - began)  # the feeding; the last run's tail is in finish
            say(f"seed {seed + run}: {result.drawn[-1]} cases fed to both builds in {result.seconds[-1]:.1f} s")
        _finished(base_pool, "base")
        _finished(pr_pool, "pr")
    return result


def _verdicts(r: Runs) -> list[dict[str, Verdict]]:
    return [{p: judge(r.outcomes.get(i, []), p, r.drawn[i]) for p in PROMISES} for i in range(len(r.seeds))]


def _report(opts: argparse.Namespace, r: Runs, verdicts: list[dict[str, Verdict]]) -> dict[str, Any]:
    return {
        "base": {"python": opts.base_python, **r.info.get("base", {})},
        "pr": {"python": opts.pr_python, **r.info.get("pr", {})},
        "promise": opts.promise,
        "min_ratio": MIN_RATIO,
        "alpha": ALPHA,
        "cases": opts.cases,
        "runs": [
            {
                "seed": r.seeds[i],
                "drawn": r.drawn[i],
                "feed_seconds": r.seconds[i],
                "verdicts": {p: v.to_json() for p, v in verdicts[i].items()},
                "outcomes": [
                    [o.index, o.entrypoint, o.group, o.identical, o.base_error, o.pr_error]
                    for o in sorted(r.outcomes.get(i, []), key=lambda o: o.index)
                ],
            }
            for i in range(len(r.seeds))
        ],
    }


def _one_case(opts: argparse.Namespace, r: Runs) -> int:
    found = r.outcomes.get(0, [])
    if not found:
        print(f"{PREFIX}: the case did not run in both builds", file=sys.stderr)
        return 2
    o = found[0]
    worse = is_worse(o.base_error, o.pr_error, MIN_RATIO)  # judge's rule, NaN included
    line = {
        "entrypoint": o.entrypoint, "group": o.group, "nondeterministic": o.path, "identical": o.identical,
        "max_abs_diff": o.max_abs_diff, "base_error": o.base_error, "pr_error": o.pr_error, "problem": o.problem,
    }  # fmt: skip
    print(json.dumps(line))
    bad = o.problem is not None or (worse if opts.promise == "equivalent" or o.path else not o.identical)
    return 1 if bad else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PREFIX, description=(__doc__ or "").splitlines()[0])
    p.add_argument("--base-python", required=True, help="the base build's interpreter")
    p.add_argument("--pr-python", required=True, help="the PR build's interpreter")
    p.add_argument("--promise", choices=PROMISES, default="identical", help="what the PR promises (default identical)")
    p.add_argument("--cases", type=int, default=DEFAULT_CASES, help=f"cases a run draws (default {DEFAULT_CASES})")
    p.add_argument("--seed", type=int, default=0, help="Hypothesis seed of the first run")
    p.add_argument("--runs", type=int, default=1, help="runs, each on its own cases (seed, seed+1, ...)")
    p.add_argument("--budget-s", type=float, default=300.0, help="no run starts, and no case runs, past this")
    p.add_argument("--json", type=Path, default=None, help="every run's verdicts under both promises, and its cases")
    p.add_argument("--case", default=None, help="one case's JSON (a reproducer): run it through both builds")
    p.add_argument("--entrypoint", choices=ENTRYPOINTS, default=None, help="with --case: the entrypoint")
    return p


def _check(opts: argparse.Namespace) -> list[tuple[MoECase, str]] | None:
    """The one case of ``--case`` (or None); ``NotJudged`` for bad arguments."""
    if opts.cases < 1 or opts.runs < 1 or opts.budget_s <= 0:
        raise NotJudged("--cases, --runs and --budget-s must be positive")
    for flag, path in (("--base-python", opts.base_python), ("--pr-python", opts.pr_python)):
        if not (Path(path).is_file() and os.access(path, os.X_OK)):
            raise NotJudged(f"{flag} {path}: no such interpreter")
    if (opts.case is None) != (opts.entrypoint is None):
        raise NotJudged("--case and --entrypoint go together")
    if opts.case is None:
        return None
    try:
        return [(MoECase.from_json(opts.case), opts.entrypoint)]
    except (ValueError, TypeError, KeyError) as exc:
        raise NotJudged(f"--case: not a case ({exc})") from None


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)

    def say(line: str) -> None:
        print(f"{PREFIX}: {line}", flush=True)

    try:
        one = _check(opts)
        say(f"base {opts.base_python}, PR {opts.pr_python}; promise {opts.promise}")
        r = run_builds(
            opts.base_python, opts.pr_python, one, n=opts.cases, seed=opts.seed, runs=opts.runs,
            budget_s=opts.budget_s, say=say,
        )  # fmt: skip
    except (NotJudged, NotComparable) as exc:
        print(f"{PREFIX}: not judged: {exc}", file=sys.stderr)
        return 2
    except PrFailed as exc:
        print(f"{PREFIX}: FAIL: {exc}", file=sys.stderr)
        return 1
    for side in ("base", "pr"):
        info = r.info[side]
        env = info.get("env", {})
        say(
            f"{side}: vLLM {info.get('vllm')}, torch {env.get('torch')}, Triton {env.get('triton')}, "
            f"Python {info.get('python')}, {info.get('device')}"
        )
    if one is not None:
        return _one_case(opts, r)
    verdicts = _verdicts(r)
    failed = 0
    for i, v in enumerate(verdicts):
        chosen = v[opts.promise]
        failed += not chosen.ok
        label = f"run {i} (seed {r.seeds[i]})" if len(verdicts) > 1 else f"seed {r.seeds[i]}"
        for line in chosen.lines(opts.base_python, opts.pr_python):
            say(f"{label}: {line}")
    if opts.json is not None:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(opts.json, json.dumps(_report(opts, r, verdicts), indent=1) + "\n")
    if len(verdicts) > 1:
        say(f"{len(verdicts) - failed} of {len(verdicts)} runs PASS under {opts.promise}")
    return 1 if failed else 0
