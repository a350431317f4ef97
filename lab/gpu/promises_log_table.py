"""The H200 promise panel's table from the plan's closing log (``lab/gpu/e2e_plan.sh`` prints, per pair, its
``== LABEL: ...`` line and every gate's PASS/FAIL line under both promises): the one record that holds every pair,
including those whose own archive did not come back.

    python3 -m lab.gpu.promises_log_table LOG            # e.g. promises.log from e2e-promises-h200.tar.xz

Per pair: its builds, each promise's verdict (every scored, decode, greedy and GSM8K row of that promise passed),
and the figures each verdict rests on: ``identical``'s scored spread (between / within, nats/token) and decode
mean |change| at 1 in flight; ``equivalent``'s prefill and 1-in-flight decode ratios to the reference with their
upper bounds; greedy's unexplained divergences at 1 in flight; the failed rows' names.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HEAD = re.compile(r"^== (\S+): exit (\d+) wall_ms (\d+) base (\S+) pr (\S+) model (\S+) gates (\S+) promise (\S+)")
ROW = re.compile(r"^(PASS|FAIL)  (.+?(?:\((identical|equivalent)\)).*?):")


def _find(pattern: str, text: str) -> str:
    m = re.search(pattern, text)
    return m.group(1) if m else "-"


def pairs(log: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for line in log.splitlines():
        if h := HEAD.match(line):
            label, _, wall, base, pr, model, gates, _ = h.groups()
            out.append({"label": label, "base": base, "pr": pr, "model": model, "gates": gates,
                        "wall_s": int(wall) // 1000, "rows": []})  # fmt: skip
        elif out and (r := ROW.match(line)):
            rows = out[-1]["rows"]
            assert isinstance(rows, list)
            rows.append((r.group(1), r.group(3), r.group(2), line))
    return out


def row(p: dict[str, object]) -> str:
    rows: list[tuple[str, str, str, str]] = p["rows"]  # type: ignore[assignment]
    cells = []
    for promise in ("identical", "equivalent"):
        mine = [r for r in rows if r[1] == promise]
        failed = [r[2].split(",")[0].replace(f" ({promise})", "") for r in mine if r[0] == "FAIL"]
        cells.append(("FAIL (" + ", ".join(dict.fromkeys(failed)) + ")" if failed else "PASS") if mine else "-")
    text = {(r[1], r[2].split(",")[0].split(" (")[0], "1 in flight" in r[2]): r[3] for r in rows}
    scored_i = text.get(("identical", "scored", False), "")
    decode_i = text.get(("identical", "decode", True), "")
    scored_e = text.get(("equivalent", "scored", False), "")
    decode_e = text.get(("equivalent", "decode", True), "")
    greedy_e = text.get(("equivalent", "greedy", True), "")
    figures = [
        _find(r"spread (\S+ between vs \S+ within)", scored_i),
        _find(r"mean \|change\| (\S+ between vs \S+ within)", decode_i),
        _find(r"change per token \S+ / \S+ = (\S+ \(upper \S+\))", scored_e),
        _find(r"change per token \S+ / \S+ = (\S+ \(upper \S+\))", decode_e),
        # the decode path beyond KAPPA: its change over the PR's own prefill change on the same tokens (rules of 4534779)
        _find(r"path balance: \S+ decoded / \S+ in prefill on \d+ tokens = (\S+ \(upper \S+\))", decode_e),
        _find(r"(\d+) unexplained", greedy_e),
    ]
    return (
        f"| {p['label']} | {p['model']} | {p['base']} | {p['pr']} | {cells[0]} | {cells[1]} | "
        + " | ".join(figures)
        + f" | {p['wall_s']} |"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_file():
        print("usage: python3 -m lab.gpu.promises_log_table LOG (the plan's closing log)", file=sys.stderr)
        return 2
    found = pairs(Path(args[0]).read_text())
    if not found:
        print(f"{args[0]}: no '== LABEL: exit ...' lines (not an e2e_plan.sh log)", file=sys.stderr)
        return 2
    print("| pair | model | base | PR | identical | equivalent | scored spread, nats/token | decode at 1, "
          "nats/token | prefill ratio to reference | decode ratio at 1 | decode over prefill at 1 | "
          "greedy unexplained at 1 | wall s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | ---: | ---: |")
    for p in found:
        print(row(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
