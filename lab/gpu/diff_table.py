"""The differential kernel tier's false-FAIL rate and power, one row a pair of builds: ``lab/gpu/diff.sh``'s table.

    python3 -m lab.gpu.diff_table RESULT_DIR/PAIR.json... --out RESULT_DIR/diff

Each ``PAIR.json`` is one ``moegate diff --runs R --json`` report (the pair is the file's name: ``same``,
``topk-order``, ``act-fp32``, ``moe-reround``; ``EXPECT`` says what each must do). A run counts when it was
judged (a run cut short by the budget, or builds the tier could not compare, is listed apart). Per promise: the
runs that FAILed, and for a pair that must PASS the false-FAIL rate's one-sided 95 % upper bound (Clopper-Pearson:
0 FAILs in n runs bound it by 1 - 0.05**(1/n)); for a pair that must FAIL, the power. Under ``equivalent`` the
smallest p-value any group reached (how near a PASS came to failing) and the median over runs of the groups'
median error ratios.

Runs are few on a device budget (0 FAILs in 4 runs bounds the rate only by 53 %), so for a pair that must PASS
``equivalent`` the table also gives the rate the cases imply (``modelled_false_fail``): each group's share of
cases worse than the base past the margin, pooled over the pair's runs (``worse / n``, taken at its one-sided 95 %
upper bound), is the chance a case of that group counts against the PR; a run FAILs when Holm rejects any group,
i.e. when the smallest p-value is at most ``ALPHA / m`` (m: the run's testable groups), which for a group of n
cases means at least ``c`` worse cases, ``c`` the least count whose binomial tail is at most ``ALPHA / m``. With
the groups independent, a run's chance to FAIL is ``1 - prod_g P(Binomial(n_g, q_g) < c_g)``, averaged over the
pair's judged runs (their group sizes). It rests on the cases being independent draws (they are: seeded per
case) and on the bound for q, not on the runs' count. Writes ``OUT.json`` and ``OUT.md`` whole (a temporary file, then a rename). Standard library
only (the device's ``python3``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from moegate.core.golden_files import atomic_write
from moegate.kernels.paired import ALPHA, binomial_tail

PROMISES = ("identical", "equivalent")
EXPECT: dict[str, tuple[str, str, str]] = {
    "same": ("PASS", "PASS", "another interpreter of the same build"),
    "topk-order": ("FAIL", "PASS", "harmless: each token's experts summed in reverse order"),
    "act-fp32": ("FAIL", "PASS", "harmless: silu-and-mul in float32, one rounding"),
    "moe-reround": ("FAIL", "FAIL", "one more rounding of every output element (the epilogue)"),
}
"""Pair -> (identical's verdict, equivalent's, what the PR changes)."""


def upper_bound(fails: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound on a rate seen as ``fails`` in ``n`` (bisection on the binomial tail)."""
    if n == 0:
        return 1.0
    if fails >= n:
        return 1.0

    def cdf(p: float) -> float:
        return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(fails + 1))

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 1 - level else (lo, mid)
    return hi


def _tail(c: int, n: int, q: float) -> float:
    """P(Binomial(n, q) >= c)."""
    return sum(math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(max(c, 0), n + 1))


def _critical(n: int, level: float) -> int:
    """The least count c with P(Binomial(n, 1/2) >= c) <= level (n + 1: never)."""
    for c in range(n + 1):
        if binomial_tail(c, n) <= level:
            return c
    return n + 1


def run_fail_chance(sizes: dict[str, int], q: dict[str, float], alpha: float = ALPHA) -> float:
    """The chance that Holm rejects some group of a run with these testable groups' sizes, each case of group g
    worse with chance ``q[g]``, independently: Holm rejects any iff the smallest p-value is at most alpha / m."""
    level = alpha / len(sizes)
    passes = 1.0
    for name, n in sizes.items():
        passes *= 1.0 - _tail(_critical(n, level), n, q[name])
    return 1.0 - passes


def modelled_false_fail(judged: list[dict[str, Any]]) -> tuple[float, dict[str, float]] | None:
    """A run's chance to FAIL ``equivalent`` implied by the cases' worse-than-base shares (the module's docstring)."""
    pooled: dict[str, list[int]] = {}
    for r in judged:
        for g in r["verdicts"]["equivalent"]["groups"]:
            w, n = pooled.setdefault(g["group"], [0, 0])
            pooled[g["group"]] = [w + g["worse"], n + g["n"]]
    if not pooled:
        return None
    q = {name: upper_bound(w, n) for name, (w, n) in pooled.items()}
    rates = []
    for r in judged:
        sizes = {g["group"]: g["n"] for g in r["verdicts"]["equivalent"]["groups"] if g["testable"]}
        if sizes:
            rates.append(run_fail_chance(sizes, q))
    return (statistics.mean(rates) if rates else 0.0), q


def row(name: str, report: dict[str, Any]) -> dict[str, Any]:
    runs = report.get("runs", [])
    judged = [r for r in runs if not r["verdicts"]["equivalent"]["reason"].startswith("not judged")]
    out: dict[str, Any] = {"pair": name, "runs": len(runs), "judged": len(judged), "cases": report.get("cases")}
    out["paired"] = sum(r["verdicts"]["equivalent"]["paired"] for r in judged)
    expect = EXPECT.get(name)
    for i, promise in enumerate(PROMISES):
        fails = sum(r["verdicts"][promise]["verdict"] == "FAIL" for r in judged)
        out[f"{promise}_fails"] = fails
        must = expect[i] if expect else None
        out[f"{promise}_expect"] = must
        if must == "PASS":
            out[f"{promise}_false_fail_upper"] = upper_bound(fails, len(judged))
            if promise == "equivalent" and (model := modelled_false_fail(judged)) is not None:
                out["modelled_false_fail"], out["worse_share_upper"] = model
    ps = [g["p"] for r in judged for g in r["verdicts"]["equivalent"]["groups"] if g["testable"]]
    ratios = [g["median_ratio"] for r in judged for g in r["verdicts"]["equivalent"]["groups"] if g["testable"]]
    out["smallest_p"] = min(ps) if ps else None
    out["median_ratio"] = statistics.median(ratios) if ratios else None
    out["what"] = expect[2] if expect else ""
    out["note"] = report.get("not_judged", "")  # diff.sh's stub for a pair the tier did not judge at all
    for side in ("base", "pr"):
        info = report.get(side, {})
        out[side] = {k: info.get(k) for k in ("python", "vllm", "device")}
    return out


def _rate(fails: int, judged: int) -> str:
    return f"{fails}/{judged}" if judged else "-"


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| pair | PR | runs judged (cases each) | FAIL identical | FAIL equivalent | false-FAIL 95 % bound "
        "| rate the cases imply | smallest p (equivalent) | median error ratio |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        bounds = [
            f"{p} {r[f'{p}_false_fail_upper']:.1%}" for p in PROMISES if r.get(f"{p}_false_fail_upper") is not None
        ]
        marks = {p: _rate(r[f"{p}_fails"], r["judged"]) + (f" (must {r[f'{p}_expect']})" if r[f"{p}_expect"] else "")
                 for p in PROMISES}  # fmt: skip
        p = "-" if r["smallest_p"] is None else f"{r['smallest_p']:.2g}"
        ratio = "-" if r["median_ratio"] is None else f"{r['median_ratio']:.4f}"
        what = r["what"] + (f" ({r['note']})" if r.get("note") else "")
        model = "-" if r.get("modelled_false_fail") is None else f"{r['modelled_false_fail']:.2g}"
        lines.append(
            f"| {r['pair']} | {what} | {r['judged']} of {r['runs']} ({r['cases']}) | {marks['identical']} "
            f"| {marks['equivalent']} | {', '.join(bounds) or '-'} | {model} | {p} | {ratio} |"
        )
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lab.gpu.diff_table", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path, help="moegate diff --json reports, one a pair (PAIR.json)")
    ap.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    args = ap.parse_args(argv)
    rows = []
    for path in args.reports:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"diff_table: {path}: not a readable report ({exc})", file=sys.stderr)
            return 2
        rows.append(row(path.stem, report))
    atomic_write(args.out.with_suffix(".json"), json.dumps(rows, indent=1) + "\n")
    atomic_write(args.out.with_suffix(".md"), markdown(rows))
    sys.stdout.write(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
