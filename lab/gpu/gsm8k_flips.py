"""GSM8K's divergence clause re-judged from finished runs' gate JSONs, one flip at a time against the sign test.

    python -m lab.gpu.gsm8k_flips GATE_JSON...      # gate-gsm8k.json / gate-gsm8k-PROMISE.json of any H200 run

For each file, a Markdown row: the differing responses, the tie bound the run used, how many flips beyond it the
rule of one failure per flip left unexplained, and what the rule on main says (``moegate.e2e.rules.gsm8k``): the
flips whose two re-scorings agree (``stats.Divergence.against``), how many the PR decoded, the sign test, and what
stays unexplained. Only the divergence clause: the exact-match records need lm-eval's samples, which hold GSM8K's
questions and are not committed, so equal records stand in for them (as ``lab.gpu.gsm8k_rejudge`` does).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from moegate.e2e import stats
from moegate.e2e.rules import gsm8k as gsm8k_rule

ROUNDING = 0.00005
"""The summary prints the tie bound to 4 decimals: half a unit comes off, so a margin the run found beyond its bound
is never explained here (the rehearsal's planted doc 87: 0.0625 against a printed 0.0625)."""
HEADER = (
    "| run | differ | tie bound | unexplained, one failure a flip | agreeing flips (the PR's) | sign test p"
    " | unexplained now | clause now |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
)


def row(path: Path) -> str:
    gate = json.loads(path.read_text())
    printed = re.search(r"tie bound ([0-9.]+)", gate["summary"])
    if printed is None:
        raise ValueError(f"{path}: no tie bound in the gate's summary (not a gate-gsm8k JSON of a scored run?)")
    tie = float(printed.group(1)) - ROUNDING  # never wider than the bound the run used
    divs = gate["differences"][0]["divergences"]
    labels = tuple(divs[0]["tokens"]) if divs else ("base", "pr")
    records = [{"doc_id": d["doc_id"], "exact_match_strict": 0, "exact_match_flexible": 0, "response": ""}
               for d in divs]  # fmt: skip
    stand_in = type("Records", (), {"records": records})
    fresh = json.loads(json.dumps(divs))
    res = gsm8k_rule.gsm8k_result(labels, stand_in, stand_in, [], fresh, tie, detect=1.0, cap=len(records) or 1)
    flips = [d for d in fresh if "against" in d]
    pr = sum(d["against"] == labels[1] for d in flips)
    now = sum(not d["explained"] for d in fresh)
    one_by_one = now + len(flips)  # the flips the sign test now takes are the ones a failure per flip failed
    return (
        f"| {path} | {len(divs)} | {tie + ROUNDING:.4f} | {one_by_one} | {len(flips)} ({pr}) |"
        f" {stats.sign_test_greater(pr, len(flips)):.3g} | {now} | {'PASS' if res.passed else 'FAIL'} |"
    )


def main(argv: list[str]) -> int:
    if not argv or not all(Path(a).is_file() for a in argv):
        print("usage: python -m lab.gpu.gsm8k_flips GATE_JSON... (a run's gate-gsm8k*.json files)", file=sys.stderr)
        return 2
    try:
        rows = [row(Path(a)) for a in argv]
    except (ValueError, KeyError, IndexError, json.JSONDecodeError) as exc:
        print(f"gsm8k_flips: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    print(HEADER, *rows, sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
