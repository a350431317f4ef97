"""The ``equivalent`` promise's statistics for finished runs: the rows of results/e2e-equivalent.md.

    python -m lab.gpu.e2e_equivalent_table RUN...                          # runs with their own reference
    python -m lab.gpu.e2e_equivalent_table --reference-run REF RUN...      # older runs: another run's PR as it

Each ``RUN`` is a run's raw folder (``greedy-base.json``, ``greedy-pr.json``, ``scores.json``: the ``run/``
folder of a pair). A run made before the reference existed has none; ``--reference-run`` lends it one: the
PR build of another run against the same base (its scores of the base's sequences, composition 1, and its
greedy passes), which is what a reference is, provided the base's sequences are the same token for token
(the base is deterministic at a fixed composition: on the H200 and on the CPU two servers of one build
generated the same 1-in-flight continuations). Sequences the two runs do not share are left out, and the
row says how many prompts were compared.

Per run: the prefill change per token over the reference's (the damage ratio and its upper bound), the
decode ratios at each in-flight count, the bias interval against its margin, the largest token change
against its bound, and the verdicts of both promises' scored and decode rules (``moegate.e2e.rules``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moegate.e2e import run_data as e2e
from moegate.e2e.rules import equivalent, identical


def lend_reference(data: e2e.ScoreData, ref_dir: Path) -> tuple[e2e.BuildRun, int]:
    """Put another run's PR in ``data`` as its reference; the reference's run and the shared base sequences."""
    other = e2e.read_scores(ref_dir)
    if other is None:
        raise SystemExit(f"{ref_dir}: no scores.json")
    ref_label = other.labels[1]
    theirs = {s.seq_id: s.token_ids for s in other.base_sequences()}
    mine = {s.seq_id: s.token_ids for s in data.base_sequences()}
    shared = {k for k in mine if theirs.get(k) == mine[k]}
    data.sequences = [s for s in data.sequences if s.seq_id.removesuffix(e2e.PR_SEQUENCE) in shared]
    data.reference = "reference"
    data.scores["reference"] = [{k: v for k, v in other.scores[ref_label][0].items() if k in shared}]
    run = e2e.read_raw(ref_dir, ref_label, gsm8k_runs=False)
    run.build = e2e.Build("reference", "(raw)", {}, run.build.server_args)
    return run, len(shared)


def row(run_dir: Path, ref_dir: Path | None) -> str:
    data = e2e.read_scores(run_dir)
    if data is None:
        return f"| {run_dir} | no scores.json |"
    base, pr = (e2e.read_raw(run_dir, lab, gsm8k_runs=False) for lab in data.labels)
    shared = len(data.base_sequences())
    if ref_dir is not None:
        reference, shared = lend_reference(data, ref_dir)
    else:
        reference = e2e.read_raw(run_dir, data.reference, gsm8k_runs=False) if data.reference else None
    eq = equivalent.scored_result(data, reference, base, pr)
    v = eq.differences[0]["equivalent"]
    dec = [equivalent.decode_result(base, pr, reference, c, data) for c in sorted(base.greedy) if c in pr.greedy]
    ident = identical.scored_result(data)
    idec = [identical.decode_result(base, pr, c) for c in sorted(base.greedy) if c in pr.greedy]
    rat, b = v["ratio"], v["bias"]
    decode_cells = "; ".join(
        f"{d.differences[0]['equivalent_decode']['in_flight']}: {d.differences[0]['equivalent_decode']['value']:.2f}"
        f" (upper {d.differences[0]['equivalent_decode']['upper']:.2f})"
        for d in dec
        if d.differences
    )
    cells = [
        run_dir.parent.name if run_dir.name == "run" else run_dir.name,
        str(shared),
        f"{rat['pr']:.5f} / {rat['reference']:.5f} = {rat['value']:.2f} (upper {rat['upper']:.2f})",
        decode_cells or "-",
        f"{b['mean']:+.6f} [{b['low']:+.6f}, {b['high']:+.6f}] / +-{b['margin']:.6f}",
        f"{v['largest']:.3f} / {v['token_bound']:.3f}",
        "PASS" if eq.passed and all(d.passed for d in dec) else "FAIL",
        "PASS" if ident.passed and all(d.passed for d in idec) else "FAIL",
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| run | base sequences | prefill change per token, PR / reference = ratio (upper) | decode ratio by in-flight "
    "(upper) | bias nats/token [99 % interval] / margin | largest token change / bound | equivalent | identical |\n"
    "| --- | ---: | --- | --- | --- | --- | --- | --- |"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.gpu.e2e_equivalent_table", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--reference-run", type=Path, default=None, help="a run whose PR build stands in as the reference")
    args = ap.parse_args(argv)
    print(HEADER)
    for run in args.runs:
        print(row(run, args.reference_run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
