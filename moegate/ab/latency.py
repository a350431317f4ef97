"""Per-request latency of an A/B run's measured sweeps, read from vLLM's own result dicts: decode time a token.

The verdict takes one number per start and level, output tok/s over the whole measured run. That number
mixes prefill, first-token waits and decode. A PR to the MoE dispatch changes the decode step, so the
decode time a token (vLLM's ``median_tpot_ms``: time per output token after the first, median over the
run's requests) is the figure that isolates what it changes; first-token stalls (``moegate.ab.stalls``)
and the start-to-start spread they cause stay out of it. On the H200's text-routed A/B one build's decode
times varied much less from start to start than its output tok/s (``results/ab-text-routing.md``).

This module is descriptive: the report prints it beside the verdict and ``verdict.json`` keeps it; no
verdict or gate reads it. Its change per level is ``geomean(base) / geomean(PR) - 1`` over the good starts'
medians, the PR's decode speed-up (positive: the PR decodes faster), with no interval: with the few starts
an A/B has, a reader compares the two builds' ranges, which the report prints too.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from moegate.ab.plan import Run


def result_stats(run: Run, folder: str | Path, keys: tuple[str, ...]) -> dict[tuple[int, int], dict[str, float]]:
    """``(start index, concurrency) -> {key: value}`` from each good start's ``measured-c<c>.json``, for
    the runs whose JSON has every one of ``keys`` as a number; other runs are left out, so a report of a
    run written before vLLM kept a statistic still renders."""
    stats: dict[tuple[int, int], dict[str, float]] = {}
    for s in run.starts:
        if s.status != "ok":
            continue
        for c in run.plan["concurrency"]:
            path = Path(folder) / s.folder / f"measured-c{c}.json"
            try:
                raw = json.loads(path.read_text())
                stats[(s.index, c)] = {k: float(raw[k]) for k in keys}
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return stats


@dataclass(frozen=True)
class DecodeLevel:
    concurrency: int
    base: tuple[float, ...]  # median ms a token after the first, one per good start, schedule order
    pr: tuple[float, ...]

    @property
    def speedup(self) -> float | None:
        """geomean(base) / geomean(PR) - 1; None unless both builds have a positive figure."""
        if not self.base or not self.pr or min(self.base + self.pr) <= 0:
            return None
        return statistics.geometric_mean(self.base) / statistics.geometric_mean(self.pr) - 1


def decode_times(run: Run, folder: str | Path) -> list[DecodeLevel]:
    """One entry per concurrency of the plan at which some good start has a decode time, in plan order."""
    stats = result_stats(run, folder, ("median_tpot_ms",))
    role = {s.index: s.role for s in run.starts}
    levels = []
    for c in run.plan["concurrency"]:
        by_role: dict[str, list[float]] = {"base": [], "pr": []}
        for (index, cc), v in sorted(stats.items()):
            if cc == c:
                by_role[role[index]].append(v["median_tpot_ms"])
        if by_role["base"] or by_role["pr"]:
            levels.append(DecodeLevel(c, tuple(by_role["base"]), tuple(by_role["pr"])))
    return levels
