"""The kernel-tier benchmark's worker processes: N of them on one GPU, fed the cases by the parent.

Why processes: on a cold Triton cache the kernel tier's time is compilation (nearly
all of it for 500 cases on an H200 with vLLM 0.33.0, against a small fraction for a
warm replay of the same cases: ``results/kernels-0.33.0.md``), and compilation is
CPU-bound and single-threaded in a process. N
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
the unit tier drives these same processes with a stand-in runner on a CPU
(``moegate.kernels.runner``). The bookkeeping is ``moegate.kernels.tally``; how many
workers fit and the shared Triton cache, ``moegate.kernels.resources``.

A pool's workers may run in another interpreter than the parent's (``python``: a build, as the
differential tier runs one pool in the base's and one in the PR's): spawned with that executable
and that interpreter's own ``sys.path`` (``moegate.kernels.interpreters`` says why), importing moegate from the
directory the parent imports it from. A case's result may carry a payload for the parent
(``KernelResult.payload``), handed to ``Pool.on_payload`` as it arrives.
"""

from __future__ import annotations

import cProfile
import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self

from moegate.core.case import MoECase
from moegate.kernels.check import StageClock
from moegate.kernels.interpreters import spawning_in
from moegate.kernels.runner import Runner
from moegate.kernels.tally import Pass, Tally, WorkerReport, merge, profile_top


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
            results.put(("case", index, not r.closeness.ok, r.payload))
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
        text = profile_top(prof, options.cprofile) if prof is not None else ""
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

    def __init__(
        self, workers: int, runner_factory: Callable[[], Runner], options: Options, python: str | None = None
    ) -> None:
        ctx = mp.get_context("spawn")
        self.n = workers
        self.options = options
        self.python = python  # the interpreter the workers run in (a build's); None: this one
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
        self.on_payload: Callable[[dict[str, Any]], None] = lambda payload: None
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
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """Start every worker without waiting for it (several pools then start up side by side)."""
        with spawning_in(self.python):
            for proc in self._procs:
                proc.start()

    def wait_ready(self) -> dict[int, dict[str, Any]]:
        """Wait until every launched worker is ready (its ``info``) or has failed (``WorkerFailed``)."""
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
            if msg[3] is not None:
                self.on_payload(msg[3])
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
