"""Re-judge a finished H200 pair's GSM8K divergences from its raw folder (``scores.json``, ``greedy-LABEL.json``).

    python -m lab.gpu.gsm8k_rejudge RUN_DIR

Prints the run's batch noise ``M_w``, its decode-to-prefill noise ``M_d``, the tie bound before and after
GSM8K's bound took ``M_d`` (docs/design/e2e-rules.md, GSM8K) and which divergences each leaves unexplained. Only
the divergence clause: the exact-match records need lm-eval's samples, which hold GSM8K's questions and are
not committed, so equal scores stand in for them here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from moegate.e2e.rules import gsm8k as gsm8k_rule
from moegate.e2e.rules import noise
from moegate.e2e.run_data import read_raw, read_scores


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / "scores.json").is_file():
        print("usage: python -m lab.gpu.gsm8k_rejudge RUN_DIR (a pair's run folder with scores.json)", file=sys.stderr)
        return 2
    run = Path(argv[0])
    data = read_scores(run)
    assert data is not None
    greedy_1 = {lab: read_raw(run, lab).greedy[1] for lab in data.labels}
    m_w, m_d = noise.within_max(data), noise.decode_noise(data, greedy_1)  # the base's, as tie_bound takes it
    before, after = noise.tie_bound(data), noise.gsm8k_tie_bound(data, greedy_1)
    print(
        f"M_w {m_w:.4f} nats, M_d {m_d:.4f} nats; tie bound 2 M_w = {before:.4f}, GSM8K's 2 max(M_w, M_d) = {after:.4f}"
    )
    records = [{"doc_id": d["doc_id"], "exact_match_strict": 0, "exact_match_flexible": 0, "response": ""}
               for d in data.gsm8k_divergences]  # fmt: skip
    stand_in = type("Records", (), {"records": records})
    for name, tie in (("2 M_w", before), ("2 max(M_w, M_d)", after)):
        divs = json.loads(json.dumps(data.gsm8k_divergences))
        gsm8k_rule.gsm8k_result(data.labels, stand_in, stand_in, [], divs, tie, detect=1.0, cap=len(records) or 1)
        unexplained = [d["doc_id"] for d in divs if not d["explained"]]
        unjudged = [d["doc_id"] for d in divs if d.get("unjudged")]
        print(f"{name}: {len(divs)} differing responses; unexplained: {unexplained or 'none'}; "
              f"not judged by re-scoring: {unjudged or 'none'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
