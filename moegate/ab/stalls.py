"""First-token outliers in a run's measured sweeps: what a reviewer needs beside a level left *within spread*.

The verdict takes one number per start and level, output tok/s over the whole measured run, so a run in
which some requests waited long for their first token (a kernel variant compiled mid-run, a stalled
scheduler) counts as slow as a whole. This module does not change the verdict: it reads each good start's
``measured-c<c>.json`` (vLLM's own result dict) and names the runs whose first tokens stand out, so the
report can say which starts set a level's spread.

Two flags, each on the run's own first-token times (``ttft``, ms):

- **stall**: ``p99 - median >= STALL_MS`` (500 ms): at least one request waited half a second longer for
  its first token than the run's typical request. A decode step on the H200's wide model takes 8-15 ms and
  a whole prefill about 100 ms, so half a second is many steps, not noise.
- **slow first tokens**: ``median >= SLOW_FACTOR x`` (4x) the median, over the level's good starts of both
  builds, of their runs' median first-token times: every request of the run waited long. Both builds
  prefill the same prompts in a round, so the level's typical first-token time is one yardstick for all.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from moegate.ab.plan import Run

STALL_MS = 500.0
SLOW_FACTOR = 4.0


def result_stats(run: Run, folder: str | Path, keys: tuple[str, ...]) -> dict[tuple[int, int], dict[str, float]]:
    """``(start index, concurrency) -> {key: value}`` from each good start's ``measured-c<c>.json``, for
    the runs whose JSON has every one of ``keys`` as a number; other runs are left out, so a report of a
    run written before vLLM kept a statistic still renders."""
    stats: dict[tuple[int, int], dict[str, float]] = {}
    for s, c, raw in run.measured_results(folder):
        try:
            stats[(s.index, c)] = {k: float(raw[k]) for k in keys}
        except (ValueError, KeyError, TypeError):
            continue
    return stats


@dataclass(frozen=True)
class Outlier:
    start: int  # 1-based, as the report numbers starts
    label: str
    concurrency: int
    kind: str  # "stall" | "slow first tokens"
    median_ms: float
    p99_ms: float
    level_median_ms: float

    def describe(self) -> str:
        where = f"start {self.start} ({self.label}) at c={self.concurrency}"
        if self.kind == "stall":
            return f"{where}: a first token {self.p99_ms - self.median_ms:.0f} ms after the run's median ({self.median_ms:.0f} ms)"
        return (
            f"{where}: median first token {self.median_ms:.0f} ms, "
            f"{self.median_ms / self.level_median_ms:.0f}x the level's {self.level_median_ms:.0f} ms"
        )


def outliers(run: Run, folder: str | Path) -> list[Outlier]:
    """The flagged measured runs of ``run``'s good starts, in schedule order; runs whose JSON is missing
    or lacks the first-token statistics are skipped (a report of an older run still renders)."""
    stats = {
        key: (v["median_ttft_ms"], v["p99_ttft_ms"])
        for key, v in result_stats(run, folder, ("median_ttft_ms", "p99_ttft_ms")).items()
    }
    level = {c: statistics.median(m for (_, cc), (m, _) in stats.items() if cc == c) for c in {c for _, c in stats}}
    labels = {s.index: s.label for s in run.starts}
    found = []
    for (index, c), (median, p99) in sorted(stats.items()):
        kind = None
        if median >= SLOW_FACTOR * level[c]:
            kind = "slow first tokens"
        elif p99 - median >= STALL_MS:
            kind = "stall"
        if kind:
            found.append(Outlier(index + 1, labels[index], c, kind, median, p99, level[c]))
    return found
