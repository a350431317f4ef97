"""How far a token's log-probability in decode (the greedy passes) is from the same token's in prefill (the scoring).

    python3 -m tools.gpu.decode_vs_prefill PAIR_DIR...     # folders with run/scores.json and run/greedy-base.json

For the base build's greedy continuations at 1 and 4 in flight, each token's log-probability as the
greedy pass reported it (``top`` at that position) against the scored log-probability of the same
token under both scoring compositions (``scores.json``), up to where a 4-in-flight continuation
leaves the scored one. Prints per pair and in-flight count the tokens compared, the largest
difference and the share of tokens that differ at all. A GSM8K divergence happens in decode and is
re-scored in prefill: this is the noise between the two.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def measure(pair: Path) -> dict[str, tuple[int, float, float]]:
    scores = json.loads((pair / "run" / "scores.json").read_text())
    greedy = json.loads((pair / "run" / "greedy-base.json").read_text())
    seqs = {s["seq_id"]: s for s in scores["sequences"]}
    out = {}
    for c, records in greedy["greedy"].items():
        diffs = []
        for r in records:
            seq = seqs.get(r["prompt_id"])
            if seq is None:
                continue
            scored = [scores["scores"]["base"][k][r["prompt_id"]]["logprobs"] for k in (0, 1)]
            ref = seq["token_ids"][seq["start"] :]
            for p, (tok, top) in enumerate(zip(r["token_ids"], r["top"], strict=False)):
                if p >= len(ref) or ref[p] != tok:
                    break
                lp = {int(t): float(x) for t, x in top}.get(tok)
                if lp is not None:
                    diffs.append(max(abs(lp - scored[0][p]), abs(lp - scored[1][p])))
        if diffs:
            out[c] = (len(diffs), max(diffs), sum(d > 0 for d in diffs) / len(diffs))
    return out


def main(argv: list[str]) -> int:
    for arg in argv:
        figures = measure(Path(arg))
        cells = [f"{c} in flight: {n} tokens, max {m:.4f} nats, {f:.1%} differ" for c, (n, m, f) in figures.items()]
        print(f"{Path(arg).name}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
