"""The A/B's decision at one look and over the looks of a run: the statistics, vectorized over runs.

One function decides a level at a look for a real run (a batch of one) and for thousands of simulated
runs at once (``moegate/ab/simulate.py``), so what the simulations measure is the rule the report applies.
The derivation, what it promises and what it resolves are in ``docs/design/ab.md`` ("The verdict rule").

**The quantity.** Per good start and concurrency level, ``y = log(median over the run's requests of
the decode time per output token)``, a request's decode time being ``(latency - ttft) / (output_len - 1)``
(vLLM's per-request TPOT; ``moegate/ab/latency.py``). Requests share their start's server, so they are
nested in it: the start is the unit of replication and ``y`` its one figure per level (the summary-statistic
analysis of a nested design: with one figure per start the start-to-start variation, and everything within
a start, is in the spread of the ``y``, and nothing is counted as independent that is not). The median,
not the mean, so that a one-off stall that delays the few requests in flight at that moment does not move
the start's figure; a cost paid at every step, or every few steps, moves every request's decode time and so
the median.

**At a look** (``decide``): ``d = mean(y_PR) - mean(y_base)``, the log of the ratio of the builds' decode
times (negative: the PR decodes faster). Welch's standard error and Welch-Satterthwaite degrees of freedom
(the builds may differ in spread: a PCIe-bound path varies less from start to start than a launch-bound
one), and the interval ``d +- t(1 - a/2, df) se`` at the level's share ``a`` of the run's alpha. With
``L = log(1 + margin)``:

- *equivalent* when the interval lies inside ``(-L, L)``: no change of ``margin`` or more either way;
- *improved* when it lies below 0 (the PR decodes faster) and is not equivalent;
- *regressed* when it lies above 0 and is not equivalent;
- otherwise *unresolved*: the interval holds 0 and reaches past a margin.

A level whose two builds show no spread at all (``se == 0``) is equivalent when the figures are equal
and unresolved otherwise: nothing can be said about a difference without a spread to judge it by.

**Over looks** (``look_alphas``, ``settle``): the run looks after rounds ``first .. cap`` (whole rounds
A B | B A, so both builds have as many starts), ``K = cap - first + 1`` looks planned before any data. The
first look spends half of ``alpha`` (all of it if it is the only look), the later ones share the other half
evenly, and each look's part is split evenly over the ``m`` levels (Bonferroni over levels and looks). A
level's verdict is fixed at the first look that resolves it; the run stops when every level is fixed, or at
the cap. Whatever the stopping, the chance that any interval at any look misses its level's true ratio is at
most the sum of the shares, ``alpha`` (the union bound needs no independence), and a verdict can only be
wrong when its interval misses: so the chance that a run states any wrong verdict is at most ``alpha``,
and that it states a wrong *regressed* (what fails the gate) at most ``alpha / 2``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

EQUIVALENT, IMPROVED, REGRESSED, UNRESOLVED = 0, 1, 2, 3
CODES = ("equivalent", "improved", "regressed", "unresolved")

DEFAULT_ALPHA = 0.05
DEFAULT_MARGIN = 0.05
DEFAULT_FIRST_LOOK = 3
DEFAULT_CAP = 5
MIN_STARTS = 2  # a build's good starts a look needs at a level (a spread needs two)


def look_alphas(alpha: float, levels: int, first: int, cap: int) -> list[float]:
    """Each level's share of ``alpha`` at each look, looks after rounds ``first .. cap`` (``K`` looks): the
    first look spends half of ``alpha`` (all of it when it is the only one), the later looks share the other
    half evenly; each look's part is split evenly over the ``levels``. The shares sum to ``alpha``."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must lie in (0, 1)")
    if levels < 1 or not MIN_STARTS <= first <= cap:
        raise ValueError(f"need levels >= 1 and {MIN_STARTS} <= first look <= cap, got {levels}, {first}, {cap}")
    k = cap - first + 1
    weights = [1.0] if k == 1 else [0.5] + [0.5 / (k - 1)] * (k - 1)
    return [alpha * w / levels for w in weights]


def _welch(base: NDArray[np.float64], pr: NDArray[np.float64]) -> tuple[NDArray, NDArray, NDArray]:
    """(d, se, df) over the last axis of each; df is Welch-Satterthwaite, inf where se is 0."""
    nb, npr = base.shape[-1], pr.shape[-1]
    if nb < MIN_STARTS or npr < MIN_STARTS:
        raise ValueError(f"a look needs >= {MIN_STARTS} starts a build, got {nb} base and {npr} PR")
    d = pr.mean(axis=-1) - base.mean(axis=-1)
    vb = base.var(axis=-1, ddof=1) / nb
    vp = pr.var(axis=-1, ddof=1) / npr
    se2 = vb + vp
    denom = vb * vb / (nb - 1) + vp * vp / (npr - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(denom > 0, se2 * se2 / np.where(denom > 0, denom, 1.0), np.inf)
    return d, np.sqrt(se2), df


def decide(base: ArrayLike, pr: ArrayLike, a: float, margin: float) -> dict[str, NDArray]:
    """The decision at one look (module docstring): ``base`` and ``pr`` hold log decode times, starts on the
    last axis (any leading axes: runs, levels). Returns arrays ``d``, ``se``, ``df``, ``lo``, ``hi`` (the
    interval of ``log(PR / base)`` at confidence ``1 - a``) and ``code`` (EQUIVALENT ... UNRESOLVED)."""
    from scipy import stats

    x, y = np.asarray(base, dtype=float), np.asarray(pr, dtype=float)
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("log decode times must be finite")
    if not 0 < a < 1 or margin <= 0:
        raise ValueError(f"need 0 < a < 1 and margin > 0, got a={a}, margin={margin}")
    d, se, df = _welch(x, y)
    q = stats.t.ppf(1.0 - a / 2.0, np.where(np.isfinite(df), df, 1e12))
    half = np.where(se > 0, q * se, 0.0)
    lo, hi = d - half, d + half
    big = math.log1p(margin)
    code = np.full(d.shape, UNRESOLVED, dtype=np.int8)
    spread = se > 0
    equivalent = (lo > -big) & (hi < big) & (spread | (d == 0))
    code[equivalent] = EQUIVALENT
    code[spread & ~equivalent & (hi < 0)] = IMPROVED
    code[spread & ~equivalent & (lo > 0)] = REGRESSED
    return {"d": d, "se": se, "df": df, "lo": lo, "hi": hi, "code": code}


def settle(codes: ArrayLike) -> tuple[NDArray[np.int8], NDArray[np.int64], NDArray[np.int64]]:
    """``codes[..., look, level]`` (each look's decisions) to what the run states: per level the code of
    the first look that resolved it (UNRESOLVED if none did) and that look's index (the last look if none);
    per run the look it stops at (the first at which every level is resolved, else the last). A level never
    resolved is UNRESOLVED at the last look, which is then the stop: every level has its look at or before it."""
    c = np.asarray(codes)
    looks = c.shape[-2]
    resolved = c != UNRESOLVED
    first = np.where(resolved.any(axis=-2), resolved.argmax(axis=-2), looks - 1)
    final = np.take_along_axis(c, first[..., None, :], axis=-2)[..., 0, :].astype(np.int8)
    # a level resolved at look j counts as settled from j on, whatever later looks say
    settled = np.cumsum(resolved, axis=-2) > 0
    everywhere = settled.all(axis=-1)
    stop = np.where(everywhere.any(axis=-1), everywhere.argmax(axis=-1), looks - 1)
    return final, first, stop


_POWER_DRAWS = 20000


@functools.lru_cache(maxsize=256)
def _resolvable_in_sds(n: int, a: float, power: float) -> float:
    """The smallest true shift, in units of the start-to-start sd (the same in both builds), that Welch's
    interval at ``n`` starts a build and share ``a`` excludes 0 for with probability ``power``. Welch's
    degrees of freedom are random (they follow the two sample variances), so its power has no closed form:
    it is computed over fixed draws of the standardized mean difference and the two sample variances (a
    fixed seed: the same figure every time, monotone in the shift, so bisection applies)."""
    from scipy import stats

    rng = np.random.default_rng(20261202)
    z = rng.standard_normal(_POWER_DRAWS) * math.sqrt(2.0 / n)
    vx = rng.chisquare(n - 1, _POWER_DRAWS) / (n - 1)
    vy = rng.chisquare(n - 1, _POWER_DRAWS) / (n - 1)
    se = np.sqrt((vx + vy) / n)
    df = (vx + vy) ** 2 / (vx**2 + vy**2) * (n - 1)
    crit = stats.t.ppf(1.0 - a / 2.0, df) * se

    def power_at(shift: float) -> float:
        return float(np.mean(np.abs(shift + z) > crit))

    lo, hi = 0.0, 1.0
    while power_at(hi) < power:
        lo, hi = hi, 2 * hi
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if power_at(mid) >= power else (mid, hi)
    return hi


def resolvable(sd: float, n: int, a: float, power: float = 0.8) -> float:
    """The smallest true change (a ratio minus 1) that a look at ``n`` starts a build with share ``a``
    resolves with probability ``power``, when both builds' start figures spread with sd ``sd`` (log scale):
    its interval then excludes 1 (*improved* / *regressed*). *Equivalent* for no change needs the
    interval's half-width under the margin, which about the same figure bounds."""
    if n < MIN_STARTS:
        return math.inf
    if sd == 0:
        return 0.0
    x = sd * _resolvable_in_sds(n, a, power)
    return math.inf if x > 700 else math.expm1(x)  # past e^700 a float overflows: "no change this run can resolve"


def starts_needed(sd: float, change: float, a: float, cap: int = 1000, power: float = 0.8) -> int:
    """The fewest starts a build at which a look with share ``a`` resolves ``change`` with ``power`` at the
    start-to-start sd ``sd`` (``resolvable``); ``cap + 1`` past ``cap``. A guide: a plan whose looks reach
    that many starts gives each look a smaller share the more looks it plans."""
    for n in range(MIN_STARTS, cap + 1):
        if resolvable(sd, n, a, power) <= change:
            return n
    return cap + 1


def pooled_sd(groups: Sequence[Sequence[float]]) -> float | None:
    """Pooled sd of the groups (each build's start figures about its own mean); None below 1 degree of freedom."""
    arrays = [np.asarray(g, dtype=float) for g in groups if len(g) >= 2]
    dof = sum(len(g) - 1 for g in arrays)
    if dof < 1:
        return None
    return math.sqrt(sum(float(((g - g.mean()) ** 2).sum()) for g in arrays) / dof)
