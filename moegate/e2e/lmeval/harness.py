"""Running lm-eval's GSM8K against a build's server, in lm-eval's own environment."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moegate.e2e.lmeval.output import Gsm8kRun, attach_decoded, read_run
from moegate.e2e.lmeval.task import (
    ALL_QUESTIONS,
    DEFAULT_LIMIT,
    LM_EVAL_VERSION,
    LOCAL_TASK,
    NUM_CONCURRENT,
    NUM_FEWSHOT,
    SEED,
    TASKS,
    Gsm8kError,
    LmEvalMissing,
    eval_python,
    verify_data,
    write_task_yaml,
)
from moegate.serve.processes import log_tail, stop_group
from moegate.serve.recorder import Recorder

# --- lm-eval -------------------------------------------------------------------

DECODED = "decoded.jsonl"
"""In a run's folder: the token ids the server generated for each of lm-eval's prompts (``moegate.serve.recorder``)."""

LOCAL_LAUNCHER = Path(__file__).with_name("launcher.py")
"""lm-eval's command line with its task index built from ``--include_path`` alone (the module says why)."""


_CHECKED: dict[tuple[str, int], str] = {}
"""Interpreters found good in this process, keyed by path and mtime: a run checks once, not before each lm-eval run
(importing lm-eval to ask is several seconds of CPU, and a same-build smoke run starts lm-eval four times)."""


def check_lm_eval(python: str | os.PathLike[str], timeout_s: float = 120) -> str:
    """lm-eval's version in ``python`` (a venv folder, or empty for ``eval_python()``'s default).

    ``LmEvalMissing`` with one line when it is absent or another release.
    """
    py = eval_python(python or None)
    if not py.is_file():
        raise LmEvalMissing(f"lm-eval is not installed in {py}: no such interpreter")
    key = (str(py), py.stat().st_mtime_ns)
    if key in _CHECKED:
        return _CHECKED[key]
    try:
        proc = subprocess.run(
            [str(py), "-c", "import importlib.metadata as m, lm_eval; print(m.version('lm_eval'))"],
            capture_output=True, text=True, timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise LmEvalMissing(f"lm-eval is not usable in {py}: importing it took over {timeout_s:.0f} s") from None
    except OSError as exc:
        raise LmEvalMissing(f"lm-eval is not installed in {py}: {exc.strerror or exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise LmEvalMissing(f"lm-eval is not installed in {py}: {last}")
    version = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "unknown"
    if version != LM_EVAL_VERSION:
        raise LmEvalMissing(
            f"lm-eval {version} in {py}; the gate is written for lm-eval[api]=={LM_EVAL_VERSION} (install that release)"
        )
    _CHECKED[key] = version
    return version


def lm_eval_argv(
    python: str | os.PathLike[str],
    *,
    base_url: str,
    model: str,
    task: str,
    include_path: Path | None,
    output_path: Path,
    limit: int,
    num_concurrent: int = NUM_CONCURRENT,
    num_fewshot: int = NUM_FEWSHOT,
    seed: int = SEED,
) -> list[str]:
    model_args = ",".join(
        [
            f"model={model}",
            f"base_url={base_url.rstrip('/')}/v1/completions",
            # N independent requests in flight, as the change description's own GSM8K run had them.
            # Which requests share a decode batch then depends on timing; on the H200 neither this
            # nor waves of N prompts per request (--batch_size N) gave a random model reproducible
            # responses (results/e2e-h200.md), so the gate runs each build twice and compares two
            # builds only where each reproduces itself (moegate/e2e/rules/gsm8k.py).
            f"num_concurrent={num_concurrent}",
            "max_retries=1",
            "tokenizer_backend=None",
            "tokenized_requests=False",
        ]
    )
    # the local task: lm-eval's command line without indexing its built-in tasks (launcher.py; -P: its folder,
    # which has a datasets.py of its own, stays off the path)
    entry = ["-P", str(LOCAL_LAUNCHER)] if include_path is not None else ["-m", "lm_eval"]
    argv = [
        str(python), *entry, "run",
        "--model", "local-completions",
        "--model_args", model_args,
        "--tasks", task,
    ]  # fmt: skip
    if include_path is not None:
        argv += ["--include_path", str(include_path)]
    argv += [
        "--num_fewshot", str(num_fewshot),
        "--limit", str(limit),
        "--log_samples",
        "--output_path", str(output_path),
        "--seed", str(seed),
    ]  # fmt: skip
    return argv


def lm_eval_env(run_dir: Path, *, local_data: bool, offline: bool = True) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if offline:
        env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if local_data:
        # the local JSONL is converted into a cache of this run's own: nothing shared between runs
        env["HF_DATASETS_CACHE"] = str(run_dir / "hf_datasets_cache")
    return env


def run_gsm8k(
    base_url: str,
    model: str,
    out_dir: str | os.PathLike[str],
    *,
    python: str | os.PathLike[str],
    limit: int = DEFAULT_LIMIT,
    task: str = LOCAL_TASK,
    data: str | os.PathLike[str] | None = None,
    check_alive: Callable[[], None] | None = None,
    timeout_s: float = 3600,
    offline: bool = True,
    num_concurrent: int = NUM_CONCURRENT,
) -> Gsm8kRun:
    """Run lm-eval's GSM8K against the server at ``base_url`` (serving ``model``); read its output back.

    ``out_dir`` must be new or empty (lm-eval appends to its samples files). ``check_alive``
    (a server's ``check_alive``) is called when lm-eval fails, times out or finishes, so a
    dead server is reported as such, with its own log tail, rather than as an lm-eval error.
    """
    if task not in TASKS:
        raise Gsm8kError(f"unknown GSM8K task {task!r}; known: {', '.join(TASKS)}")
    if not 1 <= limit <= ALL_QUESTIONS:
        raise Gsm8kError(f"limit {limit} not in [1, {ALL_QUESTIONS}] (GSM8K's test set has {ALL_QUESTIONS} questions)")
    run_dir = Path(out_dir)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise Gsm8kError(f"{run_dir} is not empty; each GSM8K run needs a folder of its own")
    local = task == LOCAL_TASK
    checked = verify_data(data) if local else None
    python = eval_python(python or None)  # a venv folder stands for its bin/python; empty: the default
    check_lm_eval(python)
    run_dir.mkdir(parents=True, exist_ok=True)
    include = None
    if checked is not None:
        include = run_dir / "tasks"
        write_task_yaml(include, checked, task)
    results_dir = run_dir / "lm_eval"
    log = run_dir / "lm_eval.log"
    t0 = time.monotonic()
    # lm-eval talks to the server through the recorder, which keeps the token ids each response was decoded as
    with Recorder(base_url, run_dir / DECODED) as rec, open(log, "wb") as fh:
        argv = lm_eval_argv(
            python, base_url=rec.url, model=model, task=task, include_path=include,
            output_path=results_dir, limit=limit, num_concurrent=num_concurrent,
        )  # fmt: skip
        fh.write(f"# moegate: {' '.join(argv)}\n# moegate: {rec.url} records the ids {base_url} generates\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=lm_eval_env(run_dir, local_data=local, offline=offline), cwd=run_dir, start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            if check_alive is not None:
                check_alive()
            raise Gsm8kError(
                f"lm-eval did not finish in {timeout_s:.0f} s; log {log}, last lines:\n{log_tail(log)}"
            ) from None
        except BaseException:
            stop_group(proc)
            raise
    seconds = time.monotonic() - t0
    if check_alive is not None:
        check_alive()  # a server that died is named as such, with its own log tail
    if code != 0:
        raise Gsm8kError(f"lm-eval exited with {code}; log {log}, last lines:\n{log_tail(log)}")
    run = attach_decoded(read_run(results_dir, task), run_dir / DECODED)
    run.limit, run.seconds, run.command = limit, seconds, argv
    run.data_sha256 = dict(checked.sha256) if checked is not None else {}
    if len(run.records) != limit:
        raise Gsm8kError(f"lm-eval logged {len(run.records)} questions, {limit} were asked; log {log}")
    return run


def run_on_server(server: Any, out_dir: str | os.PathLike[str], **kwargs: Any) -> Gsm8kRun:
    """``run_gsm8k`` against a running ``moegate.serve.server.Server``."""
    return run_gsm8k(server.url, server.model_name, out_dir, check_alive=server.check_alive, **kwargs)
