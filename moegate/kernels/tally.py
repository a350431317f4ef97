"""The kernel sweep's bookkeeping: each worker's tally of cases, numerics and paths, merged into a pass, and its profile line."""

from __future__ import annotations

import cProfile
import io
import pstats
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from moegate.core.case import MoECase
from moegate.core.spec import expected_path
from moegate.core.tensors import torch_dtype
from moegate.kernels.check import KernelResult
from moegate.kernels.systematic import Sample
from moegate.kernels.tolerance import rounding_count

PATH_MISMATCHES_KEPT = 20  # a wrong rule mismatches hundreds of cases; the first ones say it


class Tally:
    """What a pass saw: counts, the worst error per numeric family, the failures, the aggregate check's samples."""

    def __init__(self) -> None:
        self.stats: Counter[str] = Counter()
        self.worst: dict[str, float] = {}
        self.failures: list[str] = []
        self.samples: list[Sample] = []  # moegate.kernels.systematic: summarised once the pass is merged

    def add(self, case: MoECase, entrypoint: str, r: KernelResult) -> None:
        stats, worst = self.stats, self.worst
        # the figures the tolerance rules are calibrated on: worst error in units of u*(A + rms A) per
        # numeric family; for fp8, the worst err/tol of each stage of the staged check
        if case.quant is None or case.quant.weight_only:
            family = ("unquantized-" + case.dtype) if case.quant is None else "wNa16"
            units = r.closeness.worst_ratio * rounding_count(torch_dtype(case.dtype), case.quant)
            worst[family] = max(worst.get(family, 0.0), units)
        else:
            for stage, ratio in (r.closeness.stages or {}).items():
                key = f"fp8-g{max(case.quant.group_size, 0)} {stage} (err/tol)"
                worst[key] = max(worst.get(key, 0.0), ratio)
        stats["cases"] += 1
        if r.systematic is not None:
            self.samples.append(r.systematic)
        stats[f"path_{r.path}"] += 1
        stats[f"placement_{case.placement.label}"] += 1
        if case.quant is not None:
            stats[f"quant_{case.quant.scheme}"] += 1
        if case.expert_map is not None:
            stats["expert_map"] += 1
        if not r.closeness.ok:
            stats["numeric_fail"] += 1
            self.failures.append(r.describe())
        if r.path != expected_path(case, entrypoint).path.value:
            stats["path_mismatch"] += 1
            if len(self.failures) < PATH_MISMATCHES_KEPT:
                self.failures.append("path mismatch: " + r.describe())

    def merge(self, other: Tally) -> None:
        """Add ``other``'s counts, keep the larger worst error per family, append its failures."""
        self.stats.update(other.stats)
        for key, value in other.worst.items():
            self.worst[key] = max(self.worst.get(key, 0.0), value)
        self.failures.extend(other.failures)
        self.samples.extend(other.samples)


@dataclass
class WorkerReport:
    """One worker's pass: its tally, its seconds from the release to its last case, its stages, its memory."""

    index: int
    tally: Tally
    seconds: float
    stages: dict[str, float]
    memory: dict[str, int]


@dataclass
class Pass:
    """Every worker's pass merged: wall-clock seconds, stage seconds and busy seconds summed over the workers."""

    tally: Tally
    seconds: float
    stages: dict[str, float]
    worker_seconds: float
    workers: list[WorkerReport]


def merge(reports: Iterable[WorkerReport], seconds: float) -> Pass:
    """The pass of all ``reports`` (failures in worker order); ``seconds``: release to the last worker's end."""
    ordered = sorted(reports, key=lambda r: r.index)
    tally = Tally()
    stages: dict[str, float] = {}
    for report in ordered:
        tally.merge(report.tally)
        for name, value in report.stages.items():
            stages[name] = stages.get(name, 0.0) + value
    return Pass(tally, seconds, stages, sum(r.seconds for r in ordered), ordered)


def profile_line(label: str, p: Pass) -> str:
    """Where a pass's time went: the stages of ``run_checked`` and the rest (waiting for a case, the loop).

    With several workers the stages are summed over them, so they add up to the
    workers' busy seconds, not to the wall clock.
    """
    n = p.tally.stats["cases"]
    rest = p.worker_seconds - sum(p.stages.values())
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(p.stages.items()))
    line = f"{label}: {n} cases in {p.seconds:.1f} s ({n / max(p.seconds, 1e-9):.2f} cases/s): {parts}, "
    line += f"waiting for cases and the rest {rest:.1f} s"
    if len(p.workers) > 1:
        line += f" (summed over {len(p.workers)} workers, {p.worker_seconds:.1f} s busy in all)"
    return line


def profile_top(prof: cProfile.Profile, n: int) -> str:
    out = io.StringIO()
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(n)
    return out.getvalue()
