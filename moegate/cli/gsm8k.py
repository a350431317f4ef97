"""``python -m moegate gsm8k run|compare``: one GSM8K run against a running server, or two runs compared.

Exit status: 0 done (compare: byte-identical), 1 compare found differences, 2 bad input or a run that
could not finish, with one clear line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from moegate.e2e.lmeval.harness import run_gsm8k
from moegate.e2e.lmeval.output import read_records, read_run, write_records
from moegate.e2e.lmeval.task import (
    ALL_QUESTIONS,
    DATA_ENV,
    DEFAULT_LIMIT,
    EVAL_PYTHON_ENV,
    FILTERS,
    LOCAL_TASK,
    TASKS,
    Gsm8kError,
    eval_python,
)
from moegate.e2e.rules.gsm8k import compare


def _load_side(path: Path, task: str) -> tuple[list[dict[str, Any]], dict[str, float] | None]:
    """A run folder (the gate's own, or an lm-eval output folder) or a records JSONL file."""
    if path.is_file():
        return read_records(path), None
    root = path / "lm_eval" if (path / "lm_eval").is_dir() else path
    run = read_run(root, task)
    return run.records, run.scores


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moegate gsm8k", description=__doc__.splitlines()[0])
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
        print(f"moegate gsm8k: {exc}", file=sys.stderr)
        return 2
