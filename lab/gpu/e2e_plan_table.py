"""The rows of results/e2e-h200-scored.md's tables, from the pair folders ``lab/gpu/e2e_plan.sh`` wrote before issue 29
(gate files without a promise in their names); runs since: ``lab/gpu/e2e_equivalent_table.py`` and each pair's pages.

    python3 -m lab.gpu.e2e_plan_table PAIR_DIR...        # e.g. /tmp/x/e2e-h200-specificity/*/

Per pair: the scored comparison's verdict and figures (``gate-scored--base-vs-pr.json``), greedy
identical/explained/unexplained at 1 and 4 in flight and each build against its repeat, the wall
time (``wall.txt``); for a failed scored comparison also its reasons and the worst sequence's row.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any


def _gate(run: Path, name: str) -> dict[str, Any] | None:
    path = run / f"gate-{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _counts(g: dict[str, Any] | None) -> str:
    if g is None:
        return "-"
    m = re.search(r"(\d+) identical, (\d+) explained \(near tie\), (\d+) unexplained", g["summary"])
    return ("PASS " if g["passed"] else "FAIL ") + ("/".join(m.groups()) if m else g["summary"][:60])


def row(pair: Path) -> str:
    run = pair / "run"
    scored = _gate(run, "scored--base-vs-pr")
    if scored is None:
        return f"| {pair.name} | no scored gate (see driver.log) |"
    v = scored["differences"][0]["verdict"]
    wall = (pair / "wall.txt").read_text().split()
    cells = [
        pair.name, f"{wall[5]} vs {wall[7]}", "PASS" if scored["passed"] else "FAIL", f"{v['sequences']} / {v['tokens']}",
        f"{v['shift_mean']:+.4f} (p={v['p_shift']:.3g})",
        f"{v['self_shift_range'][0]:+.4f}..{v['self_shift_range'][1]:+.4f}",
        f"{v['spread_between']:.5f} / {v['spread_within']:.5f} (p={max(v['p_spread'], 0.0):.2g})",
        f"{v['max_between']:.4f} / {v['token_bound']:.3f}",
        _counts(_gate(run, "greedy--1-in-flight")), _counts(_gate(run, "greedy--4-in-flight")),
        _counts(_gate(run, "greedy--base-twice--4-in-flight")) + ", " + _counts(_gate(run, "greedy--pr-twice--4-in-flight")),
        f"{int(wall[3]) / 1000:.0f}",
    ]  # fmt: skip
    out = "| " + " | ".join(cells) + " |"
    if not scored["passed"]:
        table = [line for line in scored["details_markdown"].splitlines() if line.count("|") == 8]
        out += f"\n    reasons: {' ; '.join(v['reasons'])}\n    worst: {table[2] if len(table) > 2 else '-'}"
    return out


def main(argv: list[str]) -> int:
    for arg in argv:
        print(row(Path(arg)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
