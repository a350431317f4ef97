"""The paired tests of the differential kernel tier (``moegate.kernels.paired``): the exact tail, Holm's steps, the
margin, and the family-wise false-FAIL rate over many simulated PRs at the boundary of the null hypothesis."""

from __future__ import annotations

import math
import random

import pytest

from moegate.kernels.paired import ALPHA, binomial_tail, holm, is_worse, judge_groups, sign_test


def test_the_binomial_tail_is_scipys():
    stats = pytest.importorskip("scipy.stats", reason="SciPy checks the tail where it is installed (the unit env)")
    for n in (1, 7, 20, 150, 600):
        for worse in sorted({0, 1, n // 2, (2 * n) // 3, n - 1, n}):
            expected = stats.binomtest(worse, n, 0.5, alternative="greater").pvalue
            assert binomial_tail(worse, n) == pytest.approx(expected, rel=1e-9, abs=1e-300), (worse, n)
    assert binomial_tail(5, 4) == 0.0 and binomial_tail(0, 9) == 1.0


def test_holm_steps_down_and_stops_at_the_first_group_it_keeps():
    assert holm({"a": 0.001, "b": 0.004, "c": 0.02}) == {"a", "b"}  # 0.001 <= 0.01/3, 0.004 <= 0.01/2, 0.02 > 0.01
    assert holm({"a": 0.004, "b": 0.004, "c": 0.004}) == set()  # the smallest already exceeds 0.01/3
    assert holm({"a": 0.0049, "b": 0.2}) == {"a"}
    assert holm({}) == set()


def test_a_case_is_worse_only_past_the_margin_and_an_error_that_is_not_a_number_is_worse_than_any_other():
    assert not is_worse(1.0, 1.0, 1.02) and not is_worse(1.0, 1.019, 1.02) and is_worse(1.0, 1.03, 1.02)
    assert not is_worse(0.0, 0.0, 1.02) and is_worse(0.0, 1e-9, 1.02)  # both exact: no worse; the base exact: worse
    assert is_worse(1.0, math.nan, 1.02) and not is_worse(math.nan, 1.0, 1.02) and not is_worse(math.nan, math.nan, 1.0)
    t = sign_test("g", [(1.0, 2.0)] * 9 + [(1.0, 1.0)], 1.02)
    assert (t.n, t.worse, t.median_ratio) == (10, 9, 2.0) and t.p == pytest.approx(11 / 1024)


def test_a_group_too_small_to_ever_fail_is_left_out_of_holms_count():
    """With the five-case group counted, the other's p = 0.0059 would need 0.005; without it, 0.01 holds."""
    groups = {"tiny": [(1.0, 2.0)] * 5, "big": [(1.0, 2.0)] * 16 + [(2.0, 1.0)] * 4}
    tests, rejected = judge_groups(groups, 1.02)
    by = {t.group: t for t in tests}
    assert not by["tiny"].testable and by["big"].testable and by["big"].p == pytest.approx(0.0059, abs=1e-4)
    assert rejected == {"big"}
    assert "too few cases to judge" in by["tiny"].describe()


def _simulated_pr(rng: random.Random, groups: int, cases: int, shift: float) -> bool:
    """One PR's verdict (True: FAIL) whose per-case log error ratios are ``shift`` plus a symmetric noise."""
    drawn = {}
    for g in range(groups):
        pairs = []
        for _ in range(cases):
            base = math.exp(rng.gauss(0, 0.5))
            pairs.append((base, base * math.exp(shift + rng.gauss(0, 0.05))))
        drawn[f"g{g}"] = pairs
    return bool(judge_groups(drawn, 1.0)[1])


def test_the_family_wise_false_fail_rate_is_at_most_alpha_at_the_boundary_of_the_null():
    """No margin (ratio 1) and PR errors exchangeable with the base's: every case worse with probability exactly 1/2,
    the least favourable null. Over 3,000 simulated PRs of six groups, FAILs stay within alpha (plus three standard
    errors of the simulation); with the tier's margin they are rarer still (``test_differential_power``)."""
    rng = random.Random(20261203)
    runs = 3000
    fails = sum(_simulated_pr(rng, 6, 40, 0.0) for _ in range(runs))
    assert fails / runs <= ALPHA + 3 * math.sqrt(ALPHA / runs), fails


def test_a_pr_worse_on_most_cases_fails_and_one_better_never_does():
    rng = random.Random(7)
    assert all(_simulated_pr(rng, 6, 40, 0.1) for _ in range(50))  # every case's error 10 % larger, noise 5 %
    assert not any(_simulated_pr(rng, 6, 40, -0.1) for _ in range(200))
