"""GSM8K's paired test: the exact McNemar test over the questions both builds answered, and the questions it needs.

Pure functions of numbers, as ``moegate/e2e/stats.py``; the constants are derived in docs/design/e2e-rules.md
(GSM8K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from moegate.e2e.stats import exact_min_n, normal_quantile

ALPHA_GSM8K = 0.01
"""GSM8K's family-wise level over its two filters (Bonferroni: 0.005 each)."""
DETECT_GSM8K = 0.05
"""The exact_match difference the GSM8K gate promises to detect (5 points) at ``POWER_GSM8K``."""
POWER_GSM8K = 0.8


@dataclass
class McNemar:
    """One filter's exact paired test over questions: A right and B wrong (``a_only``) against the reverse."""

    a_only: list[int]
    b_only: list[int]
    questions: int

    @property
    def discordant(self) -> int:
        return len(self.a_only) + len(self.b_only)

    @property
    def p(self) -> float:
        from scipy.stats import binomtest

        if not self.discordant:
            return 1.0
        return float(binomtest(len(self.a_only), self.discordant, 0.5).pvalue)


def mcnemar(a: dict[int, int], b: dict[int, int]) -> McNemar:
    """``a``, ``b``: doc id -> exact_match (0/1) for the same questions."""
    if a.keys() != b.keys():
        raise ValueError("the two runs answered different questions")
    return McNemar(sorted(d for d in a if a[d] and not b[d]), sorted(d for d in a if b[d] and not a[d]), len(a))


def needed_questions(
    discordance: float, *, detect: float = DETECT_GSM8K, alpha: float = ALPHA_GSM8K / 2, power: float = POWER_GSM8K
) -> int:
    """Questions the exact McNemar test needs to find an exact_match difference of ``detect`` with ``power``.

    Connor's (1987) sample size for the paired test of proportions, with the discordance rate
    ``psi`` (at least ``detect``: a difference of d needs d of the questions discordant):
    ``n = (z(1-alpha/2) sqrt(psi) + z(power) sqrt(psi - d^2))^2 / d^2``; and never fewer than the exact
    test's minimum, ``exact_min_n(alpha) / d`` questions (all discordant ones one way).
    """
    psi = max(discordance, detect)
    n = (
        normal_quantile(1 - alpha / 2) * math.sqrt(psi) + normal_quantile(power) * math.sqrt(max(psi - detect**2, 0.0))
    ) ** 2 / detect**2
    return max(math.ceil(n), math.ceil(exact_min_n(alpha) / detect))


def detectable_difference(
    discordance: float, questions: int, *, alpha: float = ALPHA_GSM8K / 2, power: float = POWER_GSM8K
) -> float:
    """The smallest exact_match difference ``needed_questions`` says ``questions`` resolve (bisection)."""
    lo, hi = 1e-4, 1.0
    if needed_questions(discordance, detect=hi, alpha=alpha, power=power) > questions:
        return math.inf
    for _ in range(60):
        mid = (lo + hi) / 2
        if needed_questions(discordance, detect=mid, alpha=alpha, power=power) <= questions:
            hi = mid
        else:
            lo = mid
    return hi
