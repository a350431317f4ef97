"""The kernel-tier benchmark's worker processes: N of them on one GPU, fed the cases by the parent.

Why processes: on a cold Triton cache the kernel tier's time is compilation (99 of
114 s for 500 cases on an H200 with vLLM 0.33.0; a warm replay of the same cases
took 2.8 s), and compilation is CPU-bound and single-threaded in a process. N
processes compile N kernel variants at once and share Triton's disk cache, so a
variant one of them compiled is loaded, not compiled again, by the others (two
that meet a new variant at the same moment both compile it; Triton's cache
writes are atomic).

How: the parent draws every case (one seeded Hypothesis run, so a seed gives the
same cases whatever N is) onto one bounded queue. Each worker is spawned (CUDA
does not survive a fork), holds its own ``VllmTarget`` and ``WeightBank``, takes
the next case when it is free (a worker busy compiling holds up no one else's
share) and runs exactly ``run_checked``, what the kernel tests assert. Start-up
(vLLM's import, CUDA's initialisation) is outside the clock: every worker reports
ready, then waits for the release. Each case's outcome comes back at once, for the
progress display; each worker's tally once, at its end. A worker that raises
reports its traceback and the case it was running; the parent stops feeding, lets
the others finish what they hold, and fails with every worker's error.

The runner is a parameter (a module-level callable the spawned worker imports), so
the unit tier drives these same processes with a stand-in runner on a CPU.
"""

from __future__ import annotations

import cProfile
import io
import multiprocessing as mp
import os
import pstats
import queue
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

from moegate.core.case import MoECase
from moegate.core.spec import expected_path
from moegate.core.tensors import torch_dtype
from moegate.kernels.check import KernelResult, StageClock
from moegate.kernels.reference import rounding_count

PATH_MISMATCHES_KEPT = 20  # a wrong rule mismatches hundreds of cases; the first ones say it


class Tally:
    """What a pass saw: counts, the worst error per numeric family, the failures."""

    def __init__(self) -> None:
        self.stats: Counter[str] = Counter()
        self.worst: dict[str, float] = {}
        self.failures: list[str] = []

    def add(self, case: MoECase, entrypoint: str, r: KernelResult) -> None:
        stats, worst = self.stats, self.worst
        # the figures the tolerance rules are calibrated on: worst error in units of u*(A + rms A) per
        # numeric family; for fp8, the worst err/tol of each stage of the staged check
        if case.quant is None or case.quant.weight_only:
            family = ("unquantized-" + case.dtype) if case.quant is None else "wNa16"
            units = r.closeness.worst_ratio * rounding_count(torch_dtype(case.dtype), case.quant)
            worst[family] = max(worst.get(family, 0.0), units)
        else:
            for stage, ratio in (r.closeness.stages or {}).items():
                key = f"fp8-g{max(case.quant.group_size, 0)} {stage} (err/tol)"
                worst[key] = max(worst.get(key, 0.0), ratio)
        stats["cases"] += 1
        stats[f"path_{r.path}"] += 1
        stats[f"placement_{case.placement.label}"] += 1
        if case.quant is not None:
            stats[f"quant_{case.quant.scheme}"] += 1
        if case.expert_map is not None:
            stats["expert_map"] += 1
        if not r.closeness.ok:
            stats["numeric_fail"] += 1
            self.failures.append(r.describe())
        if r.path != expected_path(case, entrypoint).path.value:
            stats["path_mismatch"] += 1
            if len(self.failures) < PATH_MISMATCHES_KEPT:
                self.failures.append("path mismatch: " + r.describe())

    def merge(self, other: Tally) -> None:
        """Add ``other``'s counts, keep the larger worst error per family, append its failures."""
        self.stats.update(other.stats)
        for key, value in other.worst.items():
            self.worst[key] = max(self.worst.get(key, 0.0), value)
        self.failures.extend(other.failures)


@dataclass
class WorkerReport:
    """One worker's pass: its tally, its seconds from the release to its last case, its stages, its memory."""

    index: int
    tally: Tally
    seconds: float
    stages: dict[str, float]
    memory: dict[str, int]


@dataclass
class Pass:
    """Every worker's pass merged: wall-clock seconds, stage seconds and busy seconds summed over the workers."""

    tally: Tally
    seconds: float
    stages: dict[str, float]
    worker_seconds: float
    workers: list[WorkerReport]


def merge(reports: Iterable[WorkerReport], seconds: float) -> Pass:
    """The pass of all ``reports`` (failures in worker order); ``seconds``: release to the last worker's end."""
    ordered = sorted(reports, key=lambda r: r.index)
    tally = Tally()
    stages: dict[str, float] = {}
    for report in ordered:
        tally.merge(report.tally)
        for name, value in report.stages.items():
            stages[name] = stages.get(name, 0.0) + value
    return Pass(tally, seconds, stages, sum(r.seconds for r in ordered), ordered)


def profile_line(label: str, p: Pass) -> str:
    """Where a pass's time went: the stages of ``run_checked`` and the rest (waiting for a case, the loop).

    With several workers the stages are summed over them, so they add up to the
    workers' busy seconds, not to the wall clock.
    """
    n = p.tally.stats["cases"]
    rest = p.worker_seconds - sum(p.stages.values())
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(p.stages.items()))
    line = f"{label}: {n} cases in {p.seconds:.1f} s ({n / max(p.seconds, 1e-9):.2f} cases/s): {parts}, "
    line += f"waiting for cases and the rest {rest:.1f} s"
    if len(p.workers) > 1:
        line += f" (summed over {len(p.workers)} workers, {p.worker_seconds:.1f} s busy in all)"
    return line


# --- how many workers fit ----------------------------------------------------------------

GPU_GIB_PER_WORKER = 8  # measured on the H200 at 5,000 cases: peaks 6.3-7.9 GiB allocated, 8.9 GiB reserved
HOST_GIB_PER_WORKER = 10  # pinned weights (4.4-4.9 GiB measured) plus the process and its compiler
CORES_PER_WORKER = 2  # compilation takes one; torch's CPU work and the loop the other


def auto_workers(gpu_bytes: int, host_bytes: int, cores: int) -> int:
    """Workers that fit one GPU and its host: 8 on an H200 machine (141 GB, 128 GiB, 16 cores), 2 on a 24 GB card."""
    gib = 2**30
    fit = min(
        gpu_bytes // (GPU_GIB_PER_WORKER * gib), host_bytes // (HOST_GIB_PER_WORKER * gib), cores // CORES_PER_WORKER
    )
    return max(1, int(fit))


# --- Triton's disk cache, shared by the workers -----------------------------------------


def triton_cache_dir(flag: str | None, environ: Mapping[str, str]) -> tuple[Path, str]:
    """Where Triton keeps compiled kernels for this run, and what said so.

    ``flag`` (``--triton-cache``) first, then Triton's own rule: ``TRITON_CACHE_DIR``,
    else ``$TRITON_HOME/.triton/cache``, else ``~/.triton/cache``. The caller puts the
    answer into ``TRITON_CACHE_DIR`` so every worker uses this one directory.
    """
    if flag:
        return Path(flag).expanduser().absolute(), "--triton-cache"
    if environ.get("TRITON_CACHE_DIR"):
        return Path(environ["TRITON_CACHE_DIR"]).expanduser().absolute(), "TRITON_CACHE_DIR"
    home = environ.get("TRITON_HOME") or os.path.expanduser("~")
    return Path(home).expanduser().absolute() / ".triton" / "cache", "Triton's default"


def cache_entries(path: Path) -> int:
    """Entries in a Triton cache directory: one directory per compiled kernel (or launcher) key."""
    try:
        with os.scandir(path) as it:
            return sum(1 for entry in it if entry.is_dir())
    except FileNotFoundError:
        return 0


# --- the workers ------------------------------------------------------------------------


class Runner(Protocol):
    """What a worker drives: the real one is ``VllmRunner``; the unit tier passes a stand-in."""

    info: dict[str, Any]

    def run(self, case: MoECase, entrypoint: str, clock: StageClock | None) -> KernelResult: ...

    def sync(self) -> None: ...

    def memory(self) -> dict[str, int]: ...


class VllmRunner:
    """A ``VllmTarget`` and a ``WeightBank`` on this process's GPU: ``run`` is ``run_checked``."""

    def __init__(self) -> None:
        import torch

        from moegate.kernels.check import run_checked
        from moegate.kernels.inputs import WeightBank
        from moegate.vllm.environment import describe_environment
        from moegate.vllm.target import VllmTarget

        self._torch, self._run_checked = torch, run_checked
        self.target = VllmTarget()
        if not self.target.cuda:
            raise RuntimeError("the kernel tier needs a CUDA GPU; this process sees none")
        self.bank = WeightBank(self.target.device, self.target.host_view)
        self.info = {
            "vllm": self.target.version,
            "fp8": torch.cuda.get_device_capability() >= (8, 9),  # fp8_w8a8 needs fp8 tensor cores
            "env": describe_environment(),
            "triton_cache": _triton_cache_in_use(),
        }

    def run(self, case: MoECase, entrypoint: str, clock: StageClock | None) -> KernelResult:
        result: KernelResult = self._run_checked(self.target, self.bank, case, entrypoint, clock)
        return result

    def sync(self) -> None:
        self._torch.cuda.synchronize()

    def memory(self) -> dict[str, int]:
        cuda = self._torch.cuda
        return {
            "peak_allocated": cuda.max_memory_allocated(),
            "peak_reserved": cuda.max_memory_reserved(),
            "weights_device": self.bank.device_bytes,
            "weights_pinned": self.bank.host_bytes,
        }


def _triton_cache_in_use() -> str | None:
    """The cache directory Triton itself reports in this process (None where it cannot say)."""
    try:
        import triton

        return str(triton.knobs.cache.dir)
    except Exception:  # noqa: BLE001 - an older Triton or none: the figure is then the parent's alone
        return None


@dataclass(frozen=True)
class Options:
    budget_s: float  # a worker runs no case once this many seconds have passed since the release
    profile: bool  # time each stage (a synchronisation after each), then replay the worker's cases warm
    cprofile: int = 0  # with profile: worker 0 cProfiles its replay and sends the top N lines
    threads: int = 0  # torch's CPU threads per worker (0: torch's default)


Message = tuple[Any, ...]


def worker_main(
    index: int,
    runner_factory: Callable[[], Runner],
    work: Any,
    results: Any,
    go: Any,
    replay: Any,
    abort: Any,
    options: Options,
) -> None:
    """One worker: start up, report ready, wait for the release, run cases until the sentinel, report."""
    running: tuple[MoECase, str] | None = None  # the case in hand, named if it raises
    replaying = False
    try:
        if options.threads:
            import torch

            torch.set_num_threads(options.threads)
        started = time.perf_counter()
        runner = runner_factory()
        results.put(("ready", index, {**runner.info, "startup_s": time.perf_counter() - started}))
        if not _wait(go, abort):
            return
        clock = StageClock(runner.sync) if options.profile else None
        tally, ran = Tally(), []
        start = time.perf_counter()
        while (item := _next(work, abort)) is not None:
            case, entrypoint = item
            if time.perf_counter() - start > options.budget_s:
                tally.stats["skipped_over_budget"] += 1
                continue
            running = item
            r = runner.run(case, entrypoint, clock)
            running = None
            tally.add(case, entrypoint, r)
            ran.append(item)
            results.put(("case", index, not r.closeness.ok))
        stages = dict(clock.seconds) if clock is not None else {}
        report = WorkerReport(index, tally, time.perf_counter() - start, stages, runner.memory())
        results.put(("done", index, report))
        if not options.profile or not _wait(replay, abort):
            return
        warm, warm_clock = Tally(), StageClock(runner.sync)
        prof = cProfile.Profile() if options.cprofile and index == 0 else None
        start = time.perf_counter()
        if prof is not None:
            prof.enable()
        replaying = True
        for running in ran:
            case, entrypoint = running
            warm.add(case, entrypoint, runner.run(case, entrypoint, warm_clock))
        running = None
        if prof is not None:
            prof.disable()
        seconds = time.perf_counter() - start
        text = _top(prof, options.cprofile) if prof is not None else ""
        report = WorkerReport(index, warm, seconds, dict(warm_clock.seconds), runner.memory())
        results.put(("replayed", index, report, text))
    except BaseException:  # noqa: BLE001 - every failure goes to the parent, with the case it happened on
        text = traceback.format_exc()
        if running is not None:
            case, entrypoint = running
            text = f"while {'replaying' if replaying else 'running'} {entrypoint} {case.to_json()}\n{text}"
        results.put(("error", index, text))
        raise SystemExit(1) from None


def _parent_alive() -> bool:
    parent = mp.parent_process()
    return parent is None or parent.is_alive()


def _wait(event: Any, abort: Any) -> bool:
    """Wait for ``event``; False when the run is aborted or the parent has gone."""
    while not event.wait(1.0):
        if abort.is_set() or not _parent_alive():
            return False
    return not abort.is_set()


def _next(work: Any, abort: Any) -> tuple[MoECase, str] | None:
    """The next case, or None at the sentinel, on abort, or when the parent has gone."""
    while not abort.is_set():
        try:
            item: tuple[MoECase, str] | None = work.get(timeout=1.0)
            return item
        except queue.Empty:
            if not _parent_alive():
                return None
    return None


def _top(prof: cProfile.Profile, n: int) -> str:
    out = io.StringIO()
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(n)
    return out.getvalue()


class WorkerFailed(RuntimeError):
    """One or more workers raised or died; ``errors`` maps each worker's index to what it reported."""

    def __init__(self, errors: Mapping[int, str]) -> None:
        self.errors = dict(sorted(errors.items()))
        last = {i: (text.strip().splitlines() or ["(no message)"])[-1] for i, text in self.errors.items()}
        super().__init__("; ".join(f"worker {i}: {line}" for i, line in last.items()))


class Pool:
    """The parent's side: start the workers, release them, feed them cases, gather their reports.

    ``on_case(failed)`` is called for each case a worker finished (the progress display).
    Use as a context manager: leaving it aborts and reaps any worker still running.
    """

    def __init__(self, workers: int, runner_factory: Callable[[], Runner], options: Options) -> None:
        ctx = mp.get_context("spawn")
        self.n = workers
        self.options = options
        self._work = ctx.Queue(maxsize=2 * workers)  # a little ahead of the workers, so a budget stop is prompt
        self._results = ctx.Queue()
        self._go, self._replay, self._abort = ctx.Event(), ctx.Event(), ctx.Event()
        self._procs = [
            ctx.Process(
                target=worker_main,
                args=(i, runner_factory, self._work, self._results, self._go, self._replay, self._abort, options),
                name=f"kernel-worker-{i}",
            )
            for i in range(workers)
        ]
        self.on_case: Callable[[bool], None] = lambda failed: None
        self.on_ready: Callable[[], None] = lambda: None
        self.info: dict[int, dict[str, Any]] = {}
        self.errors: dict[int, str] = {}
        self.reports: dict[int, WorkerReport] = {}
        self.replays: dict[int, tuple[WorkerReport, str]] = {}
        self.skipped = 0  # drawn after the budget or after a failure: never queued
        self._ended: dict[int, float] = {}
        self._released = 0.0
        self._closed = False

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def start(self) -> dict[int, dict[str, Any]]:
        """Start every worker and wait until each is ready (its ``info``) or has failed (``WorkerFailed``)."""
        for proc in self._procs:
            proc.start()
        while len(self.info) + len(self.errors) < self.n:
            self._pump(0.5)
        if self.errors:
            raise WorkerFailed(self.errors)
        return self.info

    def release(self) -> None:
        """Start the clock and let the workers take cases."""
        self._released = time.perf_counter()
        self._go.set()

    def submit(self, case: MoECase, entrypoint: str) -> None:
        """Queue one drawn case; past the budget or after a failure, count it skipped.

        The caller draws on either way: a Hypothesis run whose draws depend on
        outside state is ``FlakyStrategyDefinition``.
        """
        if not self._closed and (self.errors or time.perf_counter() - self._released > self.options.budget_s):
            self._close()
        while not self._closed:
            try:
                self._work.put((case, entrypoint), timeout=0.2)
                self._pump(0)
                return
            except queue.Full:
                self._pump(0)
                if self.errors:
                    self._close()
        self.skipped += 1
        self._pump(0)

    def finish(self) -> Pass:
        """No more cases: wait for every worker's report; the pass runs from the release to the last report."""
        self._close()
        while len(self.reports) + len(self.errors) < self.n:
            self._pump(0.5)
        if self.errors:
            raise WorkerFailed(self.errors)
        p = merge(self.reports.values(), max(self._ended.values()) - self._released)
        if self.skipped:
            p.tally.stats["skipped_over_budget"] += self.skipped
        return p

    def replay(self) -> tuple[Pass, str]:
        """Every worker runs its own cases again, warm, at once (``Options.profile``); worker 0's cProfile text."""
        self._ended.clear()
        start = time.perf_counter()
        self._replay.set()
        while len(self.replays) + len(self.errors) < self.n:
            self._pump(0.5)
        if self.errors:
            raise WorkerFailed(self.errors)
        p = merge((r for r, _ in self.replays.values()), max(self._ended.values()) - start)
        return p, self.replays[0][1]

    def shutdown(self) -> None:
        """Abort whatever still runs, reap every worker (terminating one that does not stop), close the queues."""
        self._abort.set()
        deadline = time.monotonic() + 30
        for proc in self._procs:
            if proc.pid is None:
                continue
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():  # stuck in a compilation or a kernel: ours to end
                proc.terminate()
                proc.join(10)
        self._work.cancel_join_thread()  # cases nobody will take must not hold up our exit
        self._work.close()
        self._results.close()

    # --- internals ---

    def _close(self) -> None:
        """Stop feeding: one sentinel per worker still running (each takes one and reports)."""
        if self._closed:
            return
        self._closed = True
        sent = 0
        while sent < self.n:
            if all(not p.is_alive() for p in self._procs):
                return
            try:
                self._work.put(None, timeout=0.2)
                sent += 1
            except queue.Full:
                self._pump(0)

    def _pump(self, timeout: float) -> None:
        """Handle every message waiting (waiting up to ``timeout`` for the first), then look for dead workers."""
        try:
            msg = self._results.get(timeout=timeout) if timeout else self._results.get_nowait()
        except queue.Empty:
            self._check_alive()
            return
        self._handle(msg)
        self._drain()
        self._check_alive()

    def _drain(self) -> None:
        while True:
            try:
                self._handle(self._results.get_nowait())
            except queue.Empty:
                return

    def _handle(self, msg: Message) -> None:
        kind, index = msg[0], msg[1]
        if kind == "case":
            self.on_case(msg[2])
        elif kind == "ready":
            self.info[index] = msg[2]
            self.on_ready()
        elif kind == "done":
            self.reports[index] = msg[2]
            self._ended[index] = time.perf_counter()
        elif kind == "replayed":
            self.replays[index] = (msg[2], msg[3])
            self._ended[index] = time.perf_counter()
        elif kind == "error":
            self.errors[index] = msg[2]
        else:
            raise RuntimeError(f"unknown message from worker {index}: {kind!r}")

    def _finished(self, index: int) -> bool:
        """Whether worker ``index`` has sent all it will send (so its exit is expected)."""
        if index in self.errors:
            return True
        if not self._go.is_set():
            return False
        done = index in self.reports
        return done and (not self.options.profile or index in self.replays)

    def _check_alive(self) -> None:
        dead = [i for i, p in enumerate(self._procs) if p.pid is not None and not p.is_alive()]
        if not any(not self._finished(i) for i in dead):
            return
        self._drain()  # its last messages may be on their way
        for i in dead:
            if not self._finished(i):
                code = self._procs[i].exitcode
                self.errors[i] = f"exited with code {code} without a report (killed? out of memory?)"
