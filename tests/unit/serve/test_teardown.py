"""A driver killed with SIGTERM still stops its server, within seconds; one killed outright leaves a record of it
(a real process tree, no vLLM).

The stand-in server is a tiny HTTP process that answers ``/health``, started by
``Server`` exactly as a vLLM server is (own process group, the build's interpreter); with
``FAKE_IGNORE_TERM=1`` it ignores SIGTERM, as vLLM's server in effect did on the H200 on
2026-12-03: it outlived the 10 s between timeout's TERM and its KILL to the driver.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from moegate.dispatch.names import API_SERVER
from moegate.serve import server
from moegate.serve.build import Build
from moegate.serve.processes import group_alive, stop_left_behind
from moegate.serve.server import Server, teardown_on_termination
from tests.support import ROOT
from tests.support.fake_server import fake_python

DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from moegate.serve.build import Build
    from moegate.serve.server import Server, teardown_on_termination
    guard = sys.argv[3] == "guarded"
    build = Build(label="fake", python=sys.argv[1])
    def serve():
        with Server(build, sys.argv[2], log_path=Path(sys.argv[2]) / "server.log", gpu_release_timeout_s=0) as srv:
            print(srv.proc.pid, flush=True)
            time.sleep(60)
    if guard:
        with teardown_on_termination():
            serve()
    else:
        serve()
    """
)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_and_kill(
    tmp_path: Path, mode: str, grace_s: float = 10.0, sig: int = signal.SIGTERM, env: dict[str, str] | None = None
) -> tuple[int, int]:
    """(server pid, driver exit code) after ``sig`` to a driver whose server is up, and ``grace_s`` for the server
    to go. The server's pgid file holds its pid while it is up."""
    (tmp_path / "config.json").write_text("{}")  # a model directory, as Server checks
    fake = fake_python(tmp_path)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(fake), str(tmp_path), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    assert driver.stdout is not None
    server_pid = int(driver.stdout.readline())
    assert (tmp_path / "server.pgid").read_text() == f"{server_pid}\n"
    driver.send_signal(sig)
    code = driver.wait(timeout=60)
    deadline = time.monotonic() + grace_s
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return server_pid, code


def test_sigterm_to_the_driver_stops_its_server(tmp_path):
    pid, code = _run_and_kill(tmp_path, "guarded")
    assert code == 128 + signal.SIGTERM
    assert not _alive(pid), "the server outlived its driver"
    assert not (tmp_path / "server.pgid").exists(), "a stopped server's record stays"


def test_a_terminated_driver_stops_a_server_that_ignores_sigterm_within_seconds(tmp_path):
    """The H200 incident: timeout's KILL came 10 s after its TERM, while the driver still waited out the 30 s
    ``stop_timeout_s`` for a server that did not go; the server outlived the driver."""
    t0 = time.monotonic()
    pid, code = _run_and_kill(tmp_path, "guarded", grace_s=0.0, env={"FAKE_IGNORE_TERM": "1"})
    assert code == 128 + signal.SIGTERM
    assert time.monotonic() - t0 < 8, "the driver waited out its normal stop"
    assert not _alive(pid), "the server outlived its driver"
    assert not (tmp_path / "server.pgid").exists()


def test_a_driver_killed_outright_leaves_its_server_and_the_record_that_stops_it(tmp_path):
    """SIGKILL leaves the driver no chance to stop its server: the next call finds it from its pgid file."""
    pid, code = _run_and_kill(tmp_path, "guarded", grace_s=0.5, sig=signal.SIGKILL)
    try:
        assert code == -signal.SIGKILL and _alive(pid)
        assert stop_left_behind(tmp_path / "server.pgid") == pid
        assert not group_alive(pid)
        assert not (tmp_path / "server.pgid").exists()
    finally:
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_without_the_guard_the_server_outlives_the_driver(tmp_path):
    """The failure the guard exists for: shows this test can fail (and cleans up after itself). Its server gets 2 s
    to go, where the guarded one is gone within the 1.4 s its whole test takes on the 2-core machine."""
    pid, code = _run_and_kill(tmp_path, "bare", grace_s=2.0)
    try:
        assert code == -signal.SIGTERM
        assert _alive(pid)
    finally:
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)


STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
)


@pytest.fixture
def stubborn_server(tmp_path, monkeypatch):
    """A ``Server`` whose process ignores SIGTERM, 30 s ``stop_timeout_s``, whose processes would hold the GPU
    for the whole 60 s ``gpu_release_timeout_s``; this process not yet marked as ending."""
    monkeypatch.setattr(server, "_terminating", threading.Event())
    (tmp_path / "config.json").write_text("{}")
    srv = Server(Build("fake", sys.executable), tmp_path, log_path=tmp_path / "server.log", gpu_release_timeout_s=60)
    proc = subprocess.Popen(
        [sys.executable, "-c", STUBBORN, API_SERVER], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    monkeypatch.setattr(server, "gpu_pids", lambda: {proc.pid})
    srv.proc = proc
    srv.pgid_path.write_text(f"{proc.pid}\n")
    try:
        yield srv, proc.pid
    finally:
        if _alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_once_a_sigterm_has_come_a_stop_takes_seconds_and_skips_the_gpu_wait(stubborn_server):
    srv, pid = stubborn_server
    with teardown_on_termination(), pytest.raises(SystemExit):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert server.terminating()
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 5
    assert not group_alive(pid) and not srv.pgid_path.exists()


def test_a_sigterm_in_the_middle_of_a_normal_stop_makes_it_quick(stubborn_server):
    srv, pid = stubborn_server
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    t0 = time.monotonic()
    with teardown_on_termination(), pytest.raises(SystemExit):
        timer.start()
        try:
            srv.stop()
        finally:
            timer.cancel()  # a stop over before the signal: it must not reach pytest
    assert time.monotonic() - t0 < 5
    assert not group_alive(pid) and not srv.pgid_path.exists()


def test_without_a_signal_a_stop_keeps_its_grace(monkeypatch):
    monkeypatch.setattr(server, "_terminating", threading.Event())
    assert server.stop_grace_s(30) == 30
    server._terminating.set()
    assert server.stop_grace_s(30) == server.TERMINATING_GRACE_S and server.stop_grace_s(1) == 1
