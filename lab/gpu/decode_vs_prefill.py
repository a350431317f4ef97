"""How far a token's log-probability in decode (the greedy passes) is from the same token's in prefill (the scoring).

    python3 -m lab.gpu.decode_vs_prefill PAIR_DIR...     # folders with run/scores.json and run/greedy-base.json

For the base build's greedy continuations at 1 and 4 in flight, each token's log-probability as the
greedy pass reported it (``top`` at that position) against the scored log-probability of the same
token under both scoring compositions (``scores.json``), up to where a 4-in-flight continuation
leaves the scored one; the files are read by moegate's own readers (``moegate.e2e.run_data.read_scores``,
``moegate.e2e.run_data.read_raw``). Prints per pair and in-flight count the tokens compared, the largest
difference and the share of tokens that differ at all. A GSM8K divergence happens in decode and is
re-scored in prefill: this is the noise between the two.
"""

from __future__ import annotations

import sys
from pathlib import Path

from moegate.e2e.run_data import read_raw, read_scores


def measure(pair: Path) -> dict[int, tuple[int, float, float]]:
    """In-flight count -> (tokens compared, largest difference, share that differ), read with moegate's readers."""
    data = read_scores(pair / "run")
    if data is None:
        raise SystemExit(f"{pair}: no run/scores.json")
    greedy = read_raw(pair / "run", "base").greedy
    seqs = {s.seq_id: s for s in data.sequences}
    out = {}
    for c, completions in greedy.items():
        diffs = []
        for r in completions:
            seq = seqs.get(r.prompt_id)
            if seq is None:
                continue
            scores = [data.scores["base"][k][r.prompt_id].logprobs for k in (0, 1)]
            ref = seq.token_ids[seq.start :]
            for p, (tok, top) in enumerate(zip(r.token_ids, r.top, strict=False)):
                if p >= len(ref) or ref[p] != tok:
                    break
                lp = dict(top).get(tok)
                if lp is not None:
                    diffs.append(max(abs(lp - scores[0][p]), abs(lp - scores[1][p])))
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
