"""The A/B verdict rule: is the PR build faster, slower, or within spread of the base, per concurrency?

The unit of replication is the **server start** (Kalibera and Jones: repeat at the level
with the most variance). Each good start of a build gives one sample per concurrency: the
output tokens/s of that start's measured ``vllm bench serve`` run at that level. For each
concurrency:

1. **Effect.** ``ratio = geomean(PR) / geomean(base)``; the change is ``ratio - 1``.
   Everything is computed on ``log(tok/s)``: ``d = mean(log PR) - mean(log base)``,
   ``ratio = exp(d)`` (means by ``math.fsum``, so the order of samples cannot matter).
2. **Spread.** Welch's t on the logs: ``se^2 = s_pr^2/n_pr + s_base^2/n_base`` (sample
   variances), Welch-Satterthwaite degrees of freedom, two-sided p-value for ``d != 0``
   (scipy's Student t).
3. **Several concurrencies (Holm).** The levels that have a p-value form one family of
   ``m`` tests at family-wise error ``alpha`` (default 0.05). Holm's step-down gives each
   level an adjusted p-value ``p_holm`` (sort ascending, multiply the i-th smallest by
   ``m - i + 1``, carry the running maximum, cap at 1); a level's difference is
   *significant* when ``p_holm < alpha``. The interval reported for a level is Welch's
   interval for the ratio at confidence ``1 - alpha * p / p_holm``: the confidence at
   which "the interval excludes 1" is exactly Holm's rejection (``p < alpha * p / p_holm``
   iff ``p_holm < alpha``). With one level that is the plain 95 % interval; for the level
   with the smallest p of ``m`` it is Bonferroni's ``1 - alpha/m``. The unadjusted 95 %
   interval is kept beside it (``ci95``).
4. **Verdict.** *improved* when the interval lies above 1 (significant, ``d > 0``) and
   ``PR/base >= 1 + min_change`` (default 2 %); *regressed* when it lies below 1 and
   ``base/PR >= 1 + min_change`` (the same 2 % measured from the faster build, so swapping
   the builds mirrors every verdict exactly); otherwise *within spread*.
5. **No verdict**, with the reason, when a build has fewer than 2 good starts at that
   level, or when both builds show **zero spread** (every start of each build gave the
   same figure: no variance can be estimated, which real tok/s figures never do unless
   rounded) and the figures differ. Zero spread with *equal* figures is *within spread*
   (``p = 1``, interval ``[1, 1]``): no division by zero happens on either branch. Levels
   without a verdict are not part of Holm's family.

6. **Starts needed.** Per level, how many starts a build the measured spread would need to
   resolve a change of ``resolve_change`` (default 5 %), so "within spread" can be read as
   "no change" or as "not enough data". The per-start spread is the pooled standard deviation
   of ``log(tok/s)`` over both builds' starts at that level (``s``, ``n_base + n_pr - 2``
   degrees of freedom). With ``n`` starts a build the comparison has ``se = s * sqrt(2/n)``
   and ``2n - 2`` degrees of freedom; a true change of ``delta = log(1 + resolve_change)`` is
   resolved when the two-sided test at ``alpha / m`` (Holm's strictest step, ``m`` the
   levels with a verdict, so the figure holds whatever the level's rank) rejects with
   probability at least ``power`` (default 0.8): the power of the t test is exact, from the
   noncentral t with noncentrality ``delta / se``. ``starts_needed`` is the smallest such
   ``n >= 2``, reported as "> cap" past ``STARTS_CAP``. It is a point estimate: ``s`` from
   2-4 starts a build is itself uncertain (its 95 % interval spans about a factor of 3 at
   2 degrees of freedom), so read it as an order of magnitude. Zero spread needs the 2 starts
   of the rule; fewer than 2 starts in all leave it unknown.

**Gate mode** fails when any level is *regressed* with a point estimate at or below
``-gate_threshold`` (default 3 %): a regression must be significant after Holm, at least
``min_change`` from the faster build's side, and at least ``gate_threshold`` in PR/base
terms. A significant regression smaller than the threshold is reported, not failed (set
``gate_threshold <= min_change`` to fail on every reported regression). Improvements never
fail. A level with **no verdict** also fails the gate: a gate must not pass on what it
could not measure.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

IMPROVED = "improved"
REGRESSED = "regressed"
WITHIN = "within spread"
NO_VERDICT = "no verdict"

DEFAULT_ALPHA = 0.05
DEFAULT_MIN_CHANGE = 0.02
DEFAULT_GATE_THRESHOLD = 0.03
MIN_STARTS = 2
DEFAULT_RESOLVE_CHANGE = 0.05
DEFAULT_POWER = 0.8
STARTS_CAP = 1000


@dataclass(frozen=True)
class Welch:
    """Welch's comparison of log(PR) against log(base) for one level (no multiplicity yet)."""

    d: float  # mean(log PR) - mean(log base)
    se: float
    df: float  # Welch-Satterthwaite; inf when se == 0
    p: float  # two-sided, for d != 0


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _var(xs: Sequence[float]) -> float:
    m = _mean(xs)
    return math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def _logs(samples: Sequence[float], name: str) -> list[float]:
    out = []
    for s in samples:
        if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise ValueError(f"{name}: throughput samples must be finite and > 0, got {s!r}")
        out.append(math.log(s))
    return out


def welch(base: Sequence[float], pr: Sequence[float]) -> Welch | None:
    """Welch's test on logs; ``None`` when there is no spread on either side and the means differ."""
    from scipy import stats

    x, y = _logs(base, "base"), _logs(pr, "pr")
    if len(x) < 2 or len(y) < 2:
        raise ValueError(f"Welch needs >= 2 samples a side, got {len(x)} base and {len(y)} PR")
    d = _mean(y) - _mean(x)
    vx, vy = _var(x) / len(x), _var(y) / len(y)
    se2 = vx + vy
    if se2 == 0.0:
        return Welch(d=0.0, se=0.0, df=math.inf, p=1.0) if d == 0.0 else None
    se = math.sqrt(se2)
    denom = (vx * vx / (len(x) - 1) if vx else 0.0) + (vy * vy / (len(y) - 1) if vy else 0.0)
    df = se2 * se2 / denom if denom > 0 else math.inf
    p = float(min(1.0, 2.0 * stats.t.sf(abs(d) / se, df)))
    return Welch(d=d, se=se, df=df, p=p)


_LOG_MAX = math.log(sys.float_info.max)


def _exp(x: float) -> float:
    """``exp`` that ends at the largest float: a bound past it stays a number in verdict.json (valid JSON)."""
    return math.exp(min(x, _LOG_MAX))


def _interval(w: Welch, confidence: float) -> tuple[float, float]:
    """Welch interval for the ratio at ``confidence`` (exp of the log-scale interval).

    With two starts a side Welch can have about one degree of freedom, and at Holm's strictest alpha the
    t quantile runs to thousands: a widely spread pair of starts (a loaded machine) put the upper log bound
    past 709, where ``math.exp`` overflows. Such a bound is given as the largest float (``_exp``)."""
    from scipy import stats

    if w.se == 0.0:
        return (_exp(w.d), _exp(w.d))
    half = float(stats.t.ppf(0.5 + confidence / 2.0, w.df)) * w.se
    return (_exp(w.d - half), _exp(w.d + half))


def holm(pvalues: Mapping[int, float]) -> dict[int, float]:
    """Holm step-down adjusted p-values (running maximum, capped at 1); keys are kept."""
    order = sorted(pvalues, key=lambda k: (pvalues[k], k))
    m = len(order)
    out: dict[int, float] = {}
    running = 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * pvalues[key]))
        out[key] = running
    return out


@dataclass(frozen=True)
class LevelVerdict:
    concurrency: int
    base: tuple[float, ...]
    pr: tuple[float, ...]
    verdict: str
    reason: str
    ratio: float | None = None  # geomean(PR) / geomean(base)
    p: float | None = None
    p_holm: float | None = None
    df: float | None = None
    confidence: float | None = None  # of ``ci``: Holm-adjusted
    ci: tuple[float, float] | None = None
    ci95: tuple[float, float] | None = None  # unadjusted, for reference
    starts_needed: int | None = None  # a build, to resolve a 5 % change (rule item 6); cap + 1 past the cap

    @property
    def change(self) -> float | None:
        return None if self.ratio is None else self.ratio - 1.0

    @property
    def starts(self) -> tuple[int, int]:
        return (len(self.base), len(self.pr))


@dataclass(frozen=True)
class Verdict:
    levels: tuple[LevelVerdict, ...]
    alpha: float
    min_change: float
    gate_threshold: float
    family_size: int  # m for Holm: levels with a p-value
    gate_failures: tuple[str, ...] = field(default=())

    @property
    def gate_passed(self) -> bool:
        return not self.gate_failures

    def level(self, concurrency: int) -> LevelVerdict:
        return next(lv for lv in self.levels if lv.concurrency == concurrency)

    def to_json(self) -> dict:
        out = asdict(self)
        out["gate_passed"] = self.gate_passed
        for lv, raw in zip(self.levels, out["levels"]):
            raw["change"] = lv.change
        return out


def rule_text(
    alpha: float = DEFAULT_ALPHA, min_change: float = DEFAULT_MIN_CHANGE, gate_threshold: float = DEFAULT_GATE_THRESHOLD
) -> str:
    """The rule in one paragraph, for reports."""
    return (
        f"One sample per server start (output tok/s of its measured run). Change = geometric mean PR / base; "
        f"Welch's t on log(tok/s) (Welch-Satterthwaite df); Holm's step-down across the concurrencies with a "
        f"verdict, family-wise {alpha:.0%}; the interval shown is at confidence 1 - {alpha:g}·p/p_Holm, where "
        f"excluding 1 is exactly Holm's rejection. *improved*: interval above 1 and PR/base >= "
        f"{1 + min_change:g}; *regressed*: interval below 1 and base/PR >= {1 + min_change:g}; otherwise "
        f"*within spread*. No verdict with fewer than {MIN_STARTS} good starts a build, or with zero spread on "
        f"both sides and different figures. Gate: fails on a *regressed* level at or below "
        f"-{gate_threshold:.0%}, or on a level with no verdict."
    )


def pooled_log_sd(base: Sequence[float], pr: Sequence[float]) -> float | None:
    """Pooled standard deviation of log(tok/s) over both builds' starts (``None`` below 1 degree of freedom)."""
    groups = [g for g in (_logs(base, "base"), _logs(pr, "pr")) if len(g) >= 2]
    dof = sum(len(g) - 1 for g in groups)
    if dof < 1:
        return None
    ss = math.fsum(_var(g) * (len(g) - 1) for g in groups)
    return math.sqrt(ss / dof)


def t_test_power(n: int, sd: float, change: float, alpha: float) -> float:
    """Power of the two-sided equal-n two-sample t test at ``alpha`` for a true ratio of ``1 + change``."""
    from scipy import stats

    delta = abs(math.log1p(change))
    if sd == 0.0:
        return 1.0 if delta > 0 else 0.0
    df = 2 * n - 2
    nc = delta / (sd * math.sqrt(2.0 / n))
    crit = float(stats.t.ppf(1.0 - alpha / 2.0, df))
    return float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))


def starts_needed(
    base: Sequence[float],
    pr: Sequence[float],
    *,
    change: float = DEFAULT_RESOLVE_CHANGE,
    alpha: float = DEFAULT_ALPHA,
    power: float = DEFAULT_POWER,
    cap: int = STARTS_CAP,
) -> int | None:
    """Rule item 6: the smallest ``n >= MIN_STARTS`` a build whose t test resolves ``change`` with ``power``.

    ``cap + 1`` when even ``cap`` starts would not; ``None`` when the spread cannot be estimated."""
    sd = pooled_log_sd(base, pr)
    if sd is None:
        return None
    if sd == 0.0:
        return MIN_STARTS
    lo, hi = MIN_STARTS, MIN_STARTS
    while t_test_power(hi, sd, change, alpha) < power:
        if hi >= cap:
            return cap + 1
        lo, hi = hi, min(cap, hi * 2)
    while lo < hi:  # power grows with n: bisect for the first n that reaches it
        mid = (lo + hi) // 2
        if t_test_power(mid, sd, change, alpha) >= power:
            hi = mid
        else:
            lo = mid + 1
    return hi


def compare(
    base: Mapping[int, Sequence[float]],
    pr: Mapping[int, Sequence[float]],
    *,
    alpha: float = DEFAULT_ALPHA,
    min_change: float = DEFAULT_MIN_CHANGE,
    gate_threshold: float = DEFAULT_GATE_THRESHOLD,
) -> Verdict:
    """Apply the rule (module docstring) to per-concurrency samples of both builds."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha} must lie in (0, 1)")
    if min_change < 0 or gate_threshold < 0:
        raise ValueError("min_change and gate_threshold must be >= 0")
    levels = sorted(set(base) | set(pr))
    tests: dict[int, Welch] = {}
    early: dict[int, tuple[str, float | None]] = {}
    for c in levels:
        b, p = tuple(base.get(c, ())), tuple(pr.get(c, ()))
        _logs(b, f"base at {c}"), _logs(p, f"PR at {c}")
        if len(b) < MIN_STARTS or len(p) < MIN_STARTS:
            early[c] = (
                f"too few good starts: base {len(b)}, PR {len(p)} (need {MIN_STARTS} a build)",
                _ratio(b, p),
            )
            continue
        w = welch(b, p)
        if w is None:
            early[c] = ("zero spread on both builds and different figures: no variance to judge by", _ratio(b, p))
            continue
        tests[c] = w
    adjusted = holm({c: w.p for c, w in tests.items()})
    log_min = math.log1p(min_change)
    out: list[LevelVerdict] = []
    for c in levels:
        b, p = tuple(base.get(c, ())), tuple(pr.get(c, ()))
        if c in early:
            reason, ratio = early[c]
            need = starts_needed(b, p, alpha=alpha / max(1, len(tests)))
            out.append(LevelVerdict(c, b, p, NO_VERDICT, reason, ratio=ratio, starts_needed=need))
            continue
        w, ph = tests[c], adjusted[c]
        gamma = alpha * w.p / ph if ph > 0 else alpha / len(tests)
        confidence = 1.0 - gamma
        ci = _interval(w, confidence)
        significant = ph < alpha
        if significant and w.d > 0 and w.d >= log_min:
            verdict, reason = IMPROVED, "interval above 1 and at least the minimum change"
        elif significant and w.d < 0 and -w.d >= log_min:
            verdict, reason = REGRESSED, "interval below 1 and at least the minimum change"
        elif significant:
            verdict, reason = WITHIN, f"significant but smaller than the {min_change:.0%} minimum"
        else:
            verdict, reason = WITHIN, f"interval contains 1 (Holm p = {ph:.3g})"
        out.append(
            LevelVerdict(
                c,
                b,
                p,
                verdict,
                reason,
                ratio=math.exp(w.d),
                p=w.p,
                p_holm=ph,
                df=w.df,
                confidence=confidence,
                ci=ci,
                ci95=_interval(w, 0.95),
                starts_needed=starts_needed(b, p, alpha=alpha / len(tests)),
            )
        )
    failures = []
    for lv in out:
        if lv.verdict == NO_VERDICT:
            failures.append(f"concurrency {lv.concurrency}: no verdict ({lv.reason})")
        elif lv.verdict == REGRESSED and lv.ratio is not None and lv.ratio <= 1.0 - gate_threshold:
            failures.append(
                f"concurrency {lv.concurrency}: regressed {lv.change:+.1%} (threshold -{gate_threshold:.0%})"
            )
    return Verdict(tuple(out), alpha, min_change, gate_threshold, len(tests), tuple(failures))


def _ratio(base: Sequence[float], pr: Sequence[float]) -> float | None:
    if not base or not pr:
        return None
    return math.exp(_mean([math.log(v) for v in pr]) - _mean([math.log(v) for v in base]))
