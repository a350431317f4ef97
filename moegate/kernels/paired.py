"""Paired tests of two builds' errors on the same cases: the statistics of the differential kernel tier.

Each case ran in the base build and in the PR build on the same inputs, and each output's error against the
one fp32 torch reference is a number per case (``moegate.kernels.differential`` computes it). The claim under
test, per group of cases (dtype family and path), is that *the PR's error is no larger than the base's*. What
it cannot be is "the PR's error is never larger": rounding makes a harmless re-implementation (another summation
order, an elementwise op redone in float32) worse than the base on some cases and better on others.

The sign test with a margin
---------------------------
A case counts as *worse* when ``pr_error > ratio * base_error`` (``ratio``: the minimum error ratio worth
reporting, ``differential.MIN_RATIO``, derived there). The null hypothesis of a group is

    H0: on every case of the group, P(worse) <= 1/2,

which holds for any PR whose per-case errors are exchangeable with the base's (a same-build pair, a
re-implementation that rounds as often but elsewhere: by symmetry P(pr > base) = P(base > pr) <= 1/2, and the
margin only lowers it) and for any PR more accurate than the base. Outputs equal bit for bit are never worse
(``pr_error == base_error < ratio * base_error``, or both 0). Cases are independent draws (their inputs are
seeded per case), so under H0 the number of worse cases ``X`` out of ``n`` is stochastically at most
Binomial(n, 1/2), whatever the cases' error distributions: the exact one-sided p-value is
``P(Binomial(n, 1/2) >= X)``. No symmetry or normality is assumed (a Wilcoxon signed-rank test would need the
paired differences symmetric under H0, which a PR more accurate on most cases but not all does not give).

A PR that adds one rounding to every output moves nearly every case past the margin (its RMS error grows by
the factor ``differential.MIN_RATIO`` is derived from, and more where its error budget is smaller), so ``X``
approaches ``n`` and the p-value ``2**-n``.

Many groups, one PR
-------------------
A PR is judged on all its groups together, so its false-FAIL rate is the family-wise error rate over them.
Holm's step-down procedure keeps that at most ``alpha`` under any dependence between the groups: sort the m
p-values, reject the i-th smallest (i = 1..m) while it is at most ``alpha / (m - i + 1)``. A group whose
smallest attainable p-value ``2**-n`` already exceeds ``alpha`` can never be rejected; it is left out of ``m``
before any error is looked at (which group that is depends only on how many cases it drew, never on their
errors, so the family-wise bound still holds) and reported as too small to judge.

Standard library only (the kernel tier's environment has no SciPy; ``tests/unit/kernels/test_paired.py``
checks the tail against SciPy's ``binomtest`` where SciPy is installed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

ALPHA = 0.01
"""The PR's false-FAIL rate across all its groups together (family-wise, Holm)."""


def binomial_tail(worse: int, n: int) -> float:
    """P(Binomial(n, 1/2) >= worse), exact (integer arithmetic, then one division)."""
    if n < 0 or worse < 0:
        raise ValueError(f"counts must be non-negative, got worse={worse}, n={n}")
    if worse > n:
        return 0.0
    total = sum(math.comb(n, j) for j in range(worse, n + 1))
    return total / 2**n


def is_worse(base_error: float, pr_error: float, ratio: float) -> bool:
    """The PR's error exceeds ``ratio`` times the base's (an error that is not finite exceeds any finite one)."""
    if math.isnan(pr_error):
        return not math.isnan(base_error)
    if math.isnan(base_error):
        return False
    return pr_error > ratio * base_error


@dataclass(frozen=True)
class SignTest:
    """One group's sign test: ``worse`` of ``n`` cases past the margin, the exact p-value, the median ratio."""

    group: str
    n: int
    worse: int
    p: float
    median_ratio: float  # median over the cases of pr_error / base_error (1 where both are 0): for the report
    testable: bool  # 2**-n <= alpha: the group can be rejected at all (else left out of Holm's m)

    def describe(self) -> str:
        state = "" if self.testable else f", too few cases to judge at alpha (2^-{self.n} > alpha)"
        return (
            f"{self.group}: {self.worse} of {self.n} cases worse than the base beyond the margin, "
            f"p = {self.p:.3g}, median error ratio {self.median_ratio:.4f}{state}"
        )


def _ratio(base_error: float, pr_error: float) -> float:
    if base_error == 0:
        return 1.0 if pr_error == 0 else math.inf
    return pr_error / base_error


def sign_test(group: str, pairs: Sequence[tuple[float, float]], ratio: float, alpha: float = ALPHA) -> SignTest:
    """The one-sided sign test of the module docstring over (base_error, pr_error) pairs."""
    n = len(pairs)
    worse = sum(is_worse(b, p, ratio) for b, p in pairs)
    ratios = sorted(_ratio(b, p) for b, p in pairs)
    median = (ratios[(n - 1) // 2] + ratios[n // 2]) / 2 if n else 1.0
    return SignTest(group, n, worse, binomial_tail(worse, n), median, n > 0 and 0.5**n <= alpha)


def holm(pvalues: Mapping[str, float], alpha: float = ALPHA) -> set[str]:
    """The groups Holm's step-down procedure rejects at family-wise level ``alpha``."""
    ordered = sorted(pvalues.items(), key=lambda kv: (kv[1], kv[0]))
    m = len(ordered)
    rejected: set[str] = set()
    for i, (name, p) in enumerate(ordered):
        if p > alpha / (m - i):
            break
        rejected.add(name)
    return rejected


def judge_groups(
    groups: Mapping[str, Sequence[tuple[float, float]]], ratio: float, alpha: float = ALPHA
) -> tuple[list[SignTest], set[str]]:
    """Every group's sign test (sorted by name) and the groups rejected, Holm over the testable ones."""
    tests = [sign_test(name, pairs, ratio, alpha) for name, pairs in sorted(groups.items())]
    rejected = holm({t.group: t.p for t in tests if t.testable}, alpha)
    return tests, rejected
