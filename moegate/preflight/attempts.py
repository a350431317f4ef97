"""One run of a tier on a GPU runner, watched, and retried once where the runner was at fault.

``run_watched`` runs a command with its output passed through as it comes (and kept, its last
``KEEP_CHARS``), its environment carrying the attempt's token, and the GPU watched for other processes while it
runs (``moegate.preflight.gpu_processes.Watch``). The caller turns what it left into a verdict
(``moegate.core.faults.classify``, with the failing tests where a report names them). ``retry_once`` runs an attempt,
and once more where the first was a **runner fault**: after waiting, at most ``wait_s``, for the other processes to
leave the GPU, since a retry beside the same neighbour would only fault again. A second fault is the verdict, never
a pass. ``moegate gate`` runs its tiers so, and ``tooling/ci/gpu_leg.py`` the legs ``moegate gate`` does not run.
"""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from moegate.core.faults import RUNNER_FAULT, GpuProcess, Outcome
from moegate.preflight.gpu_processes import (
    DRIVER_RESERVE_MIB,
    TOKEN_VARIABLE,
    Reader,
    Unlisted,
    Watch,
    gpu_processes,
    is_own,
)
from moegate.serve.processes import stop_group

KEEP_CHARS = 4_000_000
"""The output kept for the verdict: the end of it, where a failing run says why (a pytest run of the kernel tier
prints well under this)."""
DEFAULT_WAIT_S = 120.0


@dataclass(frozen=True)
class Ran:
    """What a watched run left: its exit status (negative: the signal that killed it), the end of its output, the
    other processes seen on its GPU (None: NVML never answered), and its wall time."""

    status: int
    output: str
    others: tuple[GpuProcess, ...] | None
    seconds: float


def _terminated(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_watched(
    cmd: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    reader: Reader = gpu_processes,
    unlisted: Unlisted | None = None,
    interval_s: float = 2.0,
    echo: TextIO | None = None,
) -> Ran:
    """Run ``cmd``, its output (stdout and stderr, in order) passed to ``echo`` (stdout) as it comes and kept;
    ``unlisted`` (``gpu_processes.unlisted_mib``): the GPU's memory no listed process holds, asked before it starts.

    The tier runs in a session of its own; stopped here (Ctrl-C, or SIGTERM from a runner's timeout), this stops
    it and everything it started, so no tier is left holding the GPU."""
    token = uuid.uuid4().hex
    echo = echo or sys.stdout
    kept: deque[str] = deque()
    size = 0
    start = time.monotonic()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    try:
        with Watch(token, reader, interval_s, unlisted) as watch, subprocess.Popen(
            list(cmd), cwd=cwd, env={**env, TOKEN_VARIABLE: token}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        ) as proc:  # fmt: skip
            assert proc.stdout is not None
            try:
                while chunk := os.read(proc.stdout.fileno(), 1 << 16):  # as it comes: pytest's dots have no newline
                    text = decoder.decode(chunk)
                    echo.write(text)
                    echo.flush()
                    kept.append(text)
                    size += len(text)
                    while size > KEEP_CHARS and len(kept) > 1:
                        size -= len(kept.popleft())
                status = proc.wait()
            except BaseException:
                stop_group(proc)  # the tier and everything it started, reaped
                raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
    return Ran(status, "".join(kept), watch.others(), time.monotonic() - start)


def wait_for_others(
    reader: Reader = gpu_processes,
    wait_s: float = DEFAULT_WAIT_S,
    poll_s: float = 2.0,
    unlisted: Unlisted | None = None,
) -> tuple[GpuProcess, ...]:
    """Until no process other than this one's (and its children's) holds memory on the GPU, nor memory beyond the
    driver's reserve is held under no listed process (``unlisted``), at most ``wait_s``; the others still there at the
    end (empty: the GPU is free, or NVML does not answer)."""
    end = time.monotonic() + wait_s
    while True:
        others = tuple(p for p in reader() or () if not is_own(p.pid, None))
        hidden = unlisted() if unlisted is not None else None
        if hidden is not None and hidden > DRIVER_RESERVE_MIB:
            others += (GpuProcess(0, hidden - DRIVER_RESERVE_MIB),)
        if not others or time.monotonic() >= end:
            return others
        time.sleep(poll_s)


def retry_once(
    attempt: Callable[[int], Outcome],
    say: Callable[[str], None],
    *,
    reader: Reader = gpu_processes,
    wait_s: float = DEFAULT_WAIT_S,
    unlisted: Unlisted | None = None,
) -> list[Outcome]:
    """``attempt(1)``, and ``attempt(2)`` where it was a runner fault: every attempt's outcome, the last the verdict."""
    outcomes = [attempt(1)]
    if outcomes[0].verdict == RUNNER_FAULT:
        say(f"runner fault: {outcomes[0].cause}")
        left = wait_for_others(reader, wait_s, unlisted=unlisted)
        held = f"{len(left)} other process(es) still on the GPU after {wait_s:g} s" if left else "the GPU is free"
        say(f"retrying once ({held})")
        outcomes.append(attempt(2))
        if outcomes[1].verdict == RUNNER_FAULT:
            say(f"runner fault again: {outcomes[1].cause}")
    return outcomes
