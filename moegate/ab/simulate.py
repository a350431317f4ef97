"""Simulated A/B runs through the verdict rule: its false-verdict rate on A/A runs and its power against real changes.

Each simulated run has ``cap`` rounds of starts per build (what a run may grow to); each start at each level
draws a start effect ``u`` (normal with the level's start-effect sd, or, with ``contamination`` p, a start
whose effect is ``heavy`` times wider: a start that came up slow or fast), then its requests'
``log`` decode times ``u + e_i`` (``e_i`` normal with the level's request sd, or drawn with replacement from a
measured run's residuals), and the start's figure is their median, as ``moegate/ab/latency.py`` takes it.
The PR's figures add the level's true shift (``log`` of the decode-time ratio PR / base). Then the run goes
through ``rule.decide`` at every look and ``rule.settle``, the functions the report applies.

A verdict is **false** when it contradicts the truth: *improved* when the PR is not faster, *regressed* when
it is not slower, *equivalent* when the true change is the margin or more. On an A/A run (no shift) any
improved or regressed is false; a false *regressed* is what would fail the gate.

``python -m moegate ab-simulate RUN_DIR ... [--runs 20000]`` measures both on start effects drawn like each
run's (``moegate/ab/spread.py``: per level the start-effect and request sd, requests a start, residuals)
and on stated uniform spreads (``--sd``); the committed figures and their command: ``results/ab-decode-rule.md``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from moegate.ab import rule
from moegate.ab.latency import by_level, start_decode
from moegate.ab.plan import DriverError, load_run
from moegate.ab.spread import level_spread


@dataclass(frozen=True)
class SimLevel:
    concurrency: int
    start_sd: float  # sd of the start effect, log scale
    request_sd: float  # sd of a request's log decode time about its start's
    requests: int  # a start's requests at this level
    residuals: tuple[float, ...] = ()  # measured log residuals to draw requests from, instead of the normal


@dataclass(frozen=True)
class Outcome:
    """What ``runs`` simulated runs stated: per run and level the final code and the starts a build it was
    settled at; per run the starts a build it stopped at."""

    codes: NDArray[np.int8]  # (runs, levels)
    settled_at: NDArray[np.int64]  # (runs, levels), starts a build
    stopped_at: NDArray[np.int64]  # (runs,), starts a build
    shifts: NDArray[np.float64]  # (levels,), true log(PR / base)
    margin: float

    def false_verdicts(self) -> NDArray[np.bool_]:
        """(runs, levels): the verdict contradicts the truth."""
        s = self.shifts[None, :]
        big = math.log1p(self.margin)
        return (
            ((self.codes == rule.IMPROVED) & (s >= 0))
            | ((self.codes == rule.REGRESSED) & (s <= 0))
            | ((self.codes == rule.EQUIVALENT) & (np.abs(s) >= big))
        )

    @property
    def false_run_rate(self) -> float:
        """Runs with at least one false verdict."""
        return float(self.false_verdicts().any(axis=1).mean())

    @property
    def false_regressed_rate(self) -> float:
        """Runs with a *regressed* level whose PR is not slower: a false gate failure."""
        return float(((self.codes == rule.REGRESSED) & (self.shifts[None, :] <= 0)).any(axis=1).mean())

    def share(self, code: int) -> NDArray[np.float64]:
        return (self.codes == code).mean(axis=0)

    def share_by(self, code: int, starts: int) -> NDArray[np.float64]:
        """Per level: runs that stated ``code`` at ``starts`` starts a build or fewer."""
        return ((self.codes == code) & (self.settled_at <= starts)).mean(axis=0)


def draw_figures(
    levels: Sequence[SimLevel],
    runs: int,
    starts: int,
    rng: np.random.Generator,
    contamination: float = 0.0,
    heavy: float = 5.0,
) -> NDArray[np.float64]:
    """Start figures, ``(runs, levels, starts)``: the median of each start's requests' log decode times."""
    out = np.empty((runs, len(levels), starts))
    for j, lv in enumerate(levels):
        scale = np.full((runs, starts), lv.start_sd)
        if contamination > 0:
            scale = np.where(rng.random((runs, starts)) < contamination, heavy * lv.start_sd, scale)
        u = rng.normal(0.0, 1.0, (runs, starts)) * scale
        shape = (runs, starts, max(1, lv.requests))
        if lv.residuals:
            pool = np.asarray(lv.residuals, dtype=float)
            e = pool[rng.integers(0, len(pool), shape)]
        else:
            e = rng.normal(0.0, lv.request_sd, shape)
        out[:, j, :] = u + np.median(e, axis=-1)
    return out


def simulate(
    levels: Sequence[SimLevel],
    shifts: Sequence[float],
    *,
    runs: int,
    rng: np.random.Generator,
    alpha: float = rule.DEFAULT_ALPHA,
    margin: float = rule.DEFAULT_MARGIN,
    first: int = rule.DEFAULT_FIRST_LOOK,
    cap: int = rule.DEFAULT_CAP,
    contamination: float = 0.0,
    heavy: float = 5.0,
) -> Outcome:
    """``runs`` A/B runs of the plan (looks after rounds ``first .. cap``) through the rule."""
    if len(shifts) != len(levels):
        raise ValueError(f"{len(shifts)} shifts for {len(levels)} levels")
    base = draw_figures(levels, runs, cap, rng, contamination, heavy)
    pr = draw_figures(levels, runs, cap, rng, contamination, heavy) + np.asarray(shifts, dtype=float)[None, :, None]
    shares = rule.look_alphas(alpha, len(levels), first, cap)
    looks = list(range(first, cap + 1))
    codes = np.stack(
        [rule.decide(base[..., :n], pr[..., :n], a, margin)["code"] for n, a in zip(looks, shares)], axis=1
    )
    final, at, stop = rule.settle(codes)
    n_at = np.asarray(looks)[at]
    return Outcome(final, n_at, np.asarray(looks)[stop], np.asarray(shifts, dtype=float), margin)


def levels_like(folder: str | Path, bootstrap: bool = True, same_build: bool = False) -> list[SimLevel]:
    """Each level of a run folder as the simulation's, its start figures spreading as the run's did (the
    pooled start-to-start sd over both builds, ``moegate/ab/spread.py``), nested: each start draws its
    requests' times about its own effect, with the run's request sd and requests a start (or, with
    ``bootstrap`` and a run that kept its requests, its residuals). Where independent requests alone would
    spread the median more than the starts spread (the measured requests are not independent: much of their
    spread repeats in every start), the requests are scaled down until they alone make the measured spread,
    and the start effect is 0; otherwise the start effect makes up the rest. Either way the start figures
    spread as measured."""
    run = load_run(folder)
    decode = start_decode(run, folder)
    out = []
    for c in run.plan["concurrency"]:
        sides = by_level(decode, c)
        spread = level_spread(c, sides, same_build)
        if spread.pooled_sd is None:
            raise ValueError(f"{folder}: no start-to-start spread at c={c} (fewer than 2 good starts a build)")
        total = spread.pooled_sd
        residuals = [r for xs in sides.values() for s in xs for r in s.log_residuals] if bootstrap else []
        request_sd = spread.request_sd or 0.0
        requests = max(1, round(spread.requests))
        noise = request_sd * math.sqrt(math.pi / (2 * requests))  # sd of a median of independent normal requests
        if noise >= total:
            scale = total / noise if noise > 0 else 0.0
            request_sd, effect = request_sd * scale, 0.0
            residuals = [r * scale for r in residuals]
        else:
            effect = math.sqrt(total**2 - noise**2)
        out.append(SimLevel(c, effect, request_sd, requests, tuple(residuals)))
    return out


def uniform_levels(sd: float, concurrency: Sequence[int] = (1, 2, 3, 4, 8)) -> list[SimLevel]:
    """Levels whose start figures spread with sd ``sd`` (log scale) and nothing else: one request a start
    carries the whole spread, so ``sd`` is the start-to-start sd the rule sees (``spread.py``'s pooled)."""
    return [SimLevel(c, sd, 0.0, 1) for c in concurrency]


def _row(name: str, out: Outcome, first: int, what: str) -> str:
    code = {"improved": rule.IMPROVED, "regressed": rule.REGRESSED, "equivalent": rule.EQUIVALENT}[what]
    at_first = " / ".join(f"{v:.2f}" for v in out.share_by(code, first))
    by_cap = " / ".join(f"{v:.2f}" for v in out.share(code))
    return (
        f"| {name} | {out.false_run_rate:.4f} | {out.false_regressed_rate:.4f} | {what}: {at_first} "
        f"| {by_cap} | {np.mean(out.stopped_at):.2f} |"
    )


def report(
    profiles: dict[str, list[SimLevel]],
    *,
    runs: int,
    seed: int,
    alpha: float,
    margin: float,
    first: int,
    cap: int,
    contamination: float,
) -> str:
    rng = np.random.default_rng(seed)
    big = math.log1p(margin)
    lines = [
        (
            f"Plan: looks after {first}..{cap} rounds, alpha {alpha:g} over the levels and looks, margin ±{margin:.0%}; "
            f"{runs} simulated runs a row, seed {seed}."
        ),
        "",
        (
            f"| profile, truth | runs with a false verdict | runs with a false *regressed* (gate) "
            f"| per level: the right verdict by {first} starts a build | by the cap ({cap}) | mean starts a build at stop |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for name, levels in profiles.items():
        m = len(levels)
        cases = [
            ("A/A", [0.0] * m, "equivalent"),
            (f"PR {margin:.0%} faster", [-big] * m, "improved"),
            (f"PR {margin:.0%} slower", [big] * m, "regressed"),
        ]
        for truth, shifts, what in cases:
            out = simulate(levels, shifts, runs=runs, rng=rng, alpha=alpha, margin=margin, first=first, cap=cap)
            lines.append(_row(f"{name}, {truth}", out, first, what))
        if contamination > 0:
            out = simulate(
                levels, [0.0] * m, runs=runs, rng=rng, alpha=alpha, margin=margin, first=first, cap=cap,
                contamination=contamination,
            )  # fmt: skip
            lines.append(_row(f"{name}, A/A, {contamination:.0%} of starts 5x wider", out, first, "equivalent"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="moegate ab-simulate", description=__doc__.splitlines()[0])
    p.add_argument("runs_dirs", nargs="*", type=Path, metavar="RUN_DIR", help="A/B run folders to draw spreads from")
    p.add_argument(
        "--sd", default="", help="start-to-start sds (log) of a profile alike at every level, e.g. 0.004,0.006,0.01"
    )
    p.add_argument("--runs", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alpha", type=float, default=rule.DEFAULT_ALPHA)
    p.add_argument("--margin", type=float, default=rule.DEFAULT_MARGIN)
    p.add_argument("--first-look", type=int, default=rule.DEFAULT_FIRST_LOOK)
    p.add_argument("--cap", type=int, default=rule.DEFAULT_CAP)
    p.add_argument("--contamination", type=float, default=0.1, help="share of starts 5x wider in the stress row")
    p.add_argument("--same-build", action="store_true", help="A/A runs: both labels one build (moegate.ab.spread)")
    opts = p.parse_args(argv)
    try:
        profiles = {f"like {d.name}": levels_like(d, same_build=opts.same_build) for d in opts.runs_dirs}
        for text in filter(None, opts.sd.split(",")):
            profiles[f"start sd {float(text):.1%}"] = uniform_levels(float(text))
        if not profiles:
            raise ValueError("give RUN_DIRs or --sd")
        print(
            report(
                profiles, runs=opts.runs, seed=opts.seed, alpha=opts.alpha, margin=opts.margin,
                first=opts.first_look, cap=opts.cap, contamination=opts.contamination,
            )
        )  # fmt: skip
    except (DriverError, ValueError) as exc:
        print(f"moegate.ab.simulate: {exc}", file=sys.stderr)
        return 2
    return 0
