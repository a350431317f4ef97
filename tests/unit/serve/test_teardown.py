"""A driver killed with SIGTERM still stops its server (a real process tree, no vLLM).

The stand-in server is a tiny HTTP process that answers ``/health``, started by
``Server`` exactly as a vLLM server is (own process group, the build's interpreter).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support import ROOT

FAKE_SERVER = textwrap.dedent(
    """
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)

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


def _run_and_kill(tmp_path: Path, mode: str, grace_s: float = 10.0) -> tuple[int, int]:
    """(server pid, driver exit code) after SIGTERM to a driver whose server is up, and ``grace_s`` for the server
    to go."""
    (tmp_path / "config.json").write_text("{}")  # a model directory, as Server checks
    fake = tmp_path / "fakepython"
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_server.py"} "$@"\n')
    fake.chmod(0o755)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(fake), str(tmp_path), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert driver.stdout is not None
    server_pid = int(driver.stdout.readline())
    driver.send_signal(signal.SIGTERM)
    code = driver.wait(timeout=60)
    deadline = time.monotonic() + grace_s
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return server_pid, code


def test_sigterm_to_the_driver_stops_its_server(tmp_path):
    pid, code = _run_and_kill(tmp_path, "guarded")
    assert code == 128 + signal.SIGTERM
    assert not _alive(pid), "the server outlived its driver"


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
