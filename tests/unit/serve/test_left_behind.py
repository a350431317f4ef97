"""A server left running by a killed driver is stopped from the pgid it recorded; a recycled pid is left alone.

Real process groups (``start_new_session=True``, as ``Server`` starts one) that ignore SIGTERM, as vLLM's server
in effect did on the H200 (2026-12-03): it outlived the driver's 10 s between timeout's TERM and its KILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from moegate.dispatch.names import API_SERVER
from moegate.serve.processes import group_alive, stop_left_behind

STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
)
"""A process that ignores SIGTERM, says so, and sleeps; any arguments after it are only its command line."""

WITH_CHILD = (
    "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE); "
    "c.stdout.readline(); " + STUBBORN
)
"""A leader with a stubborn child in its group (a server and its engine core)."""

ORPHAN = (
    "import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE); "
    "c.stdout.readline(); print('ready', flush=True)"
)
"""A leader that starts a stubborn child and exits: the group lives on without it."""


@contextlib.contextmanager
def group(*argv: str) -> Iterator[subprocess.Popen[str]]:
    """A process leading a session of its own, ready (it said so); its group killed afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", *argv], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _record(tmp_path: Path, pgid: int | str) -> Path:
    path = tmp_path / "server.pgid"
    path.write_text(f"{pgid}\n")
    return path


def test_a_recorded_server_still_running_is_killed_with_its_group_and_the_record_goes(tmp_path):
    with group(WITH_CHILD, STUBBORN, API_SERVER, "--port", "8000") as proc:
        recorded = _record(tmp_path, proc.pid)
        t0 = time.monotonic()
        assert stop_left_behind(recorded) == proc.pid
        assert time.monotonic() - t0 < 5
        assert not group_alive(proc.pid), "the server or its child outlived the stop"
        assert not recorded.exists()


def test_a_live_group_with_another_command_line_is_a_recycled_pid_left_alone(tmp_path):
    with group(STUBBORN, "some.other.module") as proc:
        recorded = _record(tmp_path, proc.pid)
        assert stop_left_behind(recorded) is None
        time.sleep(0.2)
        assert group_alive(proc.pid) and proc.poll() is None
        assert not recorded.exists(), "the stale record stays"


def test_the_record_of_a_group_that_is_gone_or_no_pgid_at_all_is_dropped(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    pid = int(done.stdout)
    assert not group_alive(pid)
    for text in (pid, "not a pid", "", 1):
        recorded = _record(tmp_path, text)
        assert stop_left_behind(recorded) is None
        assert not recorded.exists()
    assert stop_left_behind(tmp_path / "none.pgid") is None


def test_a_group_whose_leader_is_gone_is_what_is_left_of_the_server(tmp_path):
    """The kernel does not reuse a pid that still names a process group: the members left are the server's (an
    engine core whose API server exited), though none of them has the server's command line."""
    with group(ORPHAN, STUBBORN) as proc:
        proc.wait(timeout=10)
        assert group_alive(proc.pid), "the child went with its leader"
        assert stop_left_behind(_record(tmp_path, proc.pid)) == proc.pid
        assert not group_alive(proc.pid)
