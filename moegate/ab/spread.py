"""Where the decode time's variance lies in an A/B run: from request to request within a start, and from start to start.

``python -m moegate ab-spread RUN_DIR [RUN_DIR ...]`` prints, per run and level, a Markdown table:

- **start-to-start sd**: the sd of a build's start figures (``log`` of the start's median decode time a
  token, ``moegate/ab/latency.py``) about that build's mean, per build and pooled over both (the degrees of
  freedom are the good starts less one a build). This is the spread the verdict's test sees, and what
  decides how many starts a verdict needs.
- **request sd**: the sd of ``log`` decode time over one run's requests, pooled over the level's good
  starts (root mean square): the variation inside a start.
  Much of it is the run's own structure, the same in every start (the first requests decode while the batch
  fills, the last while it drains), not noise: on the H200 the start figures of one build varied far less
  than the sampling of ``n`` independent requests would make a median vary. So the two figures are reported
  side by side, not subtracted.
- **resolves at N**: the smallest change (a ratio minus 1) the rule resolves with 80 % power at N starts a
  build at this pooled spread, at the first look's share of alpha of the default plan (``rule.resolvable``);
  and **starts for ±X**: the starts a build at which a look with that share would resolve the margin
  (``rule.starts_needed``).

The figures for the committed H200 runs, with this command: ``results/ab-decode-spread.md``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from moegate.ab import rule
from moegate.ab.latency import StartDecode, by_level, start_decode
from moegate.ab.plan import DriverError, load_run


@dataclass(frozen=True)
class LevelSpread:
    concurrency: int
    starts: dict[str, int]  # good starts with a figure, per build
    start_sd: dict[str, float | None]  # per build
    pooled_sd: float | None
    df: int
    request_sd: float | None
    requests: float  # mean requests a start

    def resolves(self, n: int, a: float) -> float | None:
        return None if self.pooled_sd is None else rule.resolvable(self.pooled_sd, n, a)


def _sd(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) >= 2 else None


def level_spread(concurrency: int, sides: dict[str, list[StartDecode]], same_build: bool = False) -> LevelSpread:
    """``same_build``: an A/A run, its two labels one build, so every start is one group (one more degree of
    freedom than pooling the labels)."""
    groups = {role: [s.log_median for s in xs] for role, xs in sides.items()}
    pooled = rule.pooled_sd([groups["base"] + groups["pr"]] if same_build else list(groups.values()))
    df = (
        max(0, len(groups["base"]) + len(groups["pr"]) - 1)
        if same_build
        else sum(max(0, len(g) - 1) for g in groups.values())
    )
    within = [s.log_sd for xs in sides.values() for s in xs if s.log_sd is not None]
    request_sd = math.sqrt(statistics.fmean(v * v for v in within)) if within else None
    counts = [s.requests for xs in sides.values() for s in xs]
    requests = statistics.fmean(counts) if counts else 0.0
    return LevelSpread(
        concurrency,
        {role: len(g) for role, g in groups.items()},
        {role: _sd(g) for role, g in groups.items()},
        pooled,
        df,
        request_sd,
        requests,
    )


def run_spread(folder: str | Path, same_build: bool = False) -> list[LevelSpread]:
    run = load_run(folder)
    decode = start_decode(run, folder)
    return [level_spread(c, by_level(decode, c), same_build) for c in run.plan["concurrency"]]


def _pct(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f} %"


def table(runs: dict[str, list[LevelSpread]], alpha: float, margin: float, first: int, cap: int) -> str:
    lines = [
        (
            f"| run | in flight | good starts (base / PR) | start-to-start sd, base | PR | pooled (df) | request sd "
            f"| requests a start | resolves at {first} starts a build | starts a build for ±{margin:.0%} |"
        ),
        "|" + "---|" * 10,
    ]
    for name, levels in runs.items():
        a = rule.look_alphas(alpha, len(levels), first, cap)[0]
        for lv in levels:
            res = lv.resolves(first, a)
            need = None if lv.pooled_sd is None else rule.starts_needed(lv.pooled_sd, margin, a)
            lines.append(
                f"| {name} | {lv.concurrency} | {lv.starts['base']} / {lv.starts['pr']} | {_pct(lv.start_sd['base'])} "
                f"| {_pct(lv.start_sd['pr'])} | {_pct(lv.pooled_sd)} ({lv.df}) | {_pct(lv.request_sd)} "
                f"| {lv.requests:.0f} | {'–' if res is None else f'±{100 * res:.1f} %'} "
                f"| {'–' if need is None else ('> 1000' if need > 1000 else need)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="moegate ab-spread", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="A/B run folders (each with run.json and starts/)")
    p.add_argument("--alpha", type=float, default=rule.DEFAULT_ALPHA)
    p.add_argument("--margin", type=float, default=rule.DEFAULT_MARGIN)
    p.add_argument("--first-look", type=int, default=rule.DEFAULT_FIRST_LOOK)
    p.add_argument("--cap", type=int, default=rule.DEFAULT_CAP)
    p.add_argument("--same-build", action="store_true", help="an A/A run: both labels one build, one group")
    opts = p.parse_args(argv)
    try:
        runs = {folder.name: run_spread(folder, opts.same_build) for folder in opts.runs}
        print(table(runs, opts.alpha, opts.margin, opts.first_look, opts.cap))
    except (DriverError, ValueError) as exc:
        print(f"moegate.ab.spread: {exc}", file=sys.stderr)
        return 2
    return 0
