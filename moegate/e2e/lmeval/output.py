"""What an lm-eval GSM8K run leaves: its samples and results read back as one record per question, and the records' JSONL."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moegate.core.hashing import text_sha256
from moegate.e2e.lmeval.task import FILTERS, LM_EVAL_VERSION, LOCAL_TASK, Gsm8kError
from moegate.serve import recorder


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
    decoded: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    """doc id -> the token ids the server decoded for it (``prompt_ids``, ``ids``), where a recorder kept them."""


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
                "question_sha256": text_sha256(s["question"]),
                "prompt_sha256": text_sha256(s["prompt"]),
                "response_sha256": text_sha256(s["response"]),
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


def attach_decoded(run: Gsm8kRun, log: str | os.PathLike[str]) -> Gsm8kRun:
    """Each question's decoded token ids from a recorder's log (``moegate.serve.recorder``), where its prompt hash and
    its text match the record: lm-eval's response is the server's text unchanged, so a mismatch is left out."""
    path = Path(log)
    if not path.is_file():
        return run
    kept = recorder.decoded_by_prompt(path)
    for r in run.records:
        entry = kept.get(r["prompt_sha256"])
        if entry is not None and entry["text"] == r["response"] and entry.get("prompt_ids") and entry.get("ids"):
            run.decoded[int(r["doc_id"])] = {"prompt_ids": list(entry["prompt_ids"]), "ids": list(entry["ids"])}
    return run


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
