"""The e2e rules (moegate/e2e/stats.py) on simulated scorings: the null passes at its stated rate, the
measured alternatives fail, and the sizes the rule asks for follow from its formulas.

Simulations use fixed seeds, so each rate below is one fixed number; the bounds they are held to
are the rule's level plus a binomial allowance (three standard errors of that many runs).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from moegate.e2e import paired, stats
from moegate.e2e.paired import mcnemar, needed_questions
from moegate.e2e.stats import Divergence, SeqScores, decide, needed_sequences

TOKENS = 91
"""Tokens per sequence in the H200 measurement (4,377 scored tokens over 48 sequences)."""


def _noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """Same-build noise of one scoring, shaped like the H200's: mostly tiny, now and then a jump.

    Mean |difference| of two such draws is about 0.004 nats a token, the largest a few tenths.
    """
    small = rng.normal(0.0, 0.002, n)
    jumps = rng.random(n) < 0.004
    return small + jumps * rng.normal(0.0, 0.2, n)


def _run(rng: np.random.Generator, seqs: int, *, shift: float = 0.0, spread: float = 0.0) -> list[SeqScores]:
    """Four scorings per sequence; build B moved by ``shift`` nats a token and by random ``spread``."""
    out = []
    for i in range(seqs):
        base = rng.normal(-2.0, 1.5, TOKENS)
        moved = base + shift + spread * rng.standard_normal(TOKENS)
        out.append(
            SeqScores(
                f"s{i}", base + _noise(rng, TOKENS), base + _noise(rng, TOKENS),
                moved + _noise(rng, TOKENS), moved + _noise(rng, TOKENS),
            )
        )  # fmt: skip
    return out


def _allowance(rate: float, runs: int) -> float:
    return rate + 3 * math.sqrt(rate * (1 - rate) / runs) + 1 / runs


def test_the_simulated_noise_resembles_the_measured_one():
    rng = np.random.default_rng(1)
    d = _noise(rng, 100_000) - _noise(rng, 100_000)
    assert 0.002 < np.abs(d).mean() < 0.006 and 0.3 < np.abs(d[:4377]).max() < 1.5


def test_identical_scorings_pass_with_p_one():
    rng = np.random.default_rng(0)
    lp = rng.normal(-2, 1, 20)
    v = decide([SeqScores(f"s{i}", lp, lp, lp, lp) for i in range(9)])
    assert v.passed and v.p_shift == 1.0 and v.p_spread == 1.0 and v.max_between == 0.0


def test_the_same_build_fails_at_most_at_the_stated_rate():
    rng = np.random.default_rng(2026)
    runs = 300
    alarms = sum(not decide(_run(rng, 12)).passed for _ in range(runs))
    assert alarms / runs <= _allowance(stats.ALPHA_SHIFT + stats.ALPHA_SPREAD, runs), alarms


def test_a_half_percent_output_scale_fails_on_the_shift_clause():
    """The H200's planted 1.005 scale: -0.13 nats a sequence, -0.0014 a token, every sequence the same way."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(20):
        v = decide(_run(rng, 48, shift=-0.0014))
        hits += not v.passed
        assert v.shift_mean < 0
    assert hits == 20
    v = decide(_run(rng, 48, shift=-0.0014))
    assert any(r.startswith("systematic shift") for r in v.reasons) and v.p_shift < stats.ALPHA_SHIFT


def test_a_different_rounding_fails_on_the_spread_clause():
    """fp32 against bf16: changes of a few hundredths a token, as often up as down."""
    rng = np.random.default_rng(3)
    v = decide(_run(rng, 12, spread=0.03))
    assert not v.passed and any(r.startswith("spread") for r in v.reasons)
    assert v.spread_between > v.spread_within


def test_one_token_far_off_fails_on_the_token_clause():
    rng = np.random.default_rng(4)
    seqs = _run(rng, 12)
    seqs[5].b1[17] -= 3.0
    seqs[5].b2[17] -= 3.0
    v = decide(seqs)
    assert not v.passed and v.max_between_at == ("s5", 17)
    assert any(r.startswith("one token") for r in v.reasons)
    assert v.token_bound == max(stats.TOKEN_FLOOR, stats.TOKEN_FACTOR * v.noise_max)


def test_the_shift_test_is_blind_to_noise_scale_under_the_null():
    """No noise and much noise alike: the null's signed-rank p-value is the same distribution."""
    rng = np.random.default_rng(5)
    ps = [decide(_run(rng, 12, spread=0.0)).p_shift for _ in range(100)]
    assert 0.3 < float(np.mean(ps)) < 0.7


def test_needed_sequences_without_noise_is_the_exact_tests_minimum():
    assert needed_sequences([0.0] * 10, TOKENS) == stats.exact_min_n(stats.ALPHA_SHIFT) == 9
    assert 2 * 0.5**9 <= stats.ALPHA_SHIFT < 2 * 0.5**8


def test_needed_sequences_follows_the_normal_formula():
    sigma = 0.08
    rng = np.random.default_rng(6)
    shifts = rng.normal(0, sigma, 2000)
    n = needed_sequences(shifts, TOKENS)
    z = stats.normal_quantile(1 - stats.ALPHA_SHIFT / 2) + stats.normal_quantile(stats.POWER)
    want = (z * float(np.sqrt(np.mean(shifts**2))) / (stats.DETECT_NATS_PER_TOKEN * TOKENS)) ** 2 / 0.864
    assert n == math.ceil(want)
    assert needed_sequences(shifts * 2, TOKENS) > n  # more noise, more sequences
    assert needed_sequences(shifts, TOKENS, detect=0.002) < n  # a larger promise, fewer


def test_at_the_sizes_it_asks_for_the_rule_finds_the_promised_shift():
    """Power check of the size rule: at ``needed`` sequences, the promised shift fails >= POWER of the time."""
    rng = np.random.default_rng(8)
    probe = decide(_run(rng, 48))
    n = max(probe.needed, 9)
    runs = 40
    hits = sum(not decide(_run(rng, n, shift=-stats.DETECT_NATS_PER_TOKEN)).passed for _ in range(runs))
    assert hits / runs >= stats.POWER - 3 * math.sqrt(stats.POWER * (1 - stats.POWER) / runs)


# --- the near-tie rule ------------------------------------------------------------------------


def test_a_flip_between_near_tied_candidates_is_explained():
    d = Divergence(7, 9, [(7, -1.00), (9, -1.02), (3, -4.0)], [(9, -1.01), (7, -1.015), (3, -4.0)])
    ok, why = d.explain(tie=0.05)
    assert ok and "margins 0.0200 (A) and 0.0050 (B)" in why


def test_a_flip_outside_the_other_builds_top_k_is_unexplained():
    d = Divergence(7, 9, [(7, -1.0), (1, -1.1), (2, -1.2), (3, -1.3), (4, -1.4), (9, -1.5)], [(9, -1.0), (7, -1.01)])
    ok, why = d.explain(tie=1.0)
    assert not ok and "not in build A's top 5" in why


def test_a_flip_with_a_wide_margin_is_unexplained():
    d = Divergence(7, 9, [(7, -0.5), (9, -2.5)], [(9, -0.5), (7, -2.5)])
    assert not d.explain(tie=0.1)[0]
    assert d.explain(tie=2.5)[0]


def test_without_measured_noise_only_an_exact_tie_is_explained():
    assert stats.tie_bound(0.0) == stats.TIE_FLOOR == 0.0
    assert Divergence(7, 9, [(7, -1.0), (9, -1.0)], [(9, -1.0), (7, -1.0)]).explain(0.0)[0]
    assert not Divergence(7, 9, [(7, -1.0), (9, -1.001)], [(9, -1.0), (7, -1.0)]).explain(0.0)[0]


# --- GSM8K ------------------------------------------------------------------------------------


def test_mcnemar_counts_discordant_questions_and_is_scipys_exact_binomial():
    from scipy.stats import binomtest

    a = {0: 1, 1: 1, 2: 0, 3: 1, 4: 0, 5: 1}
    b = {0: 1, 1: 0, 2: 1, 3: 0, 4: 0, 5: 0}
    t = mcnemar(a, b)
    assert t.a_only == [1, 3, 5] and t.b_only == [2] and t.questions == 6
    assert t.p == binomtest(3, 4, 0.5).pvalue
    assert mcnemar(a, a).p == 1.0
    with pytest.raises(ValueError):
        mcnemar(a, {0: 1})


def test_mcnemar_false_alarm_rate_under_symmetric_noise():
    rng = np.random.default_rng(11)
    runs, n, alarms = 400, 250, 0
    for _ in range(runs):
        truth = rng.random(n) < 0.5
        a = {i: int(truth[i] ^ (rng.random() < 0.06)) for i in range(n)}
        b = {i: int(truth[i] ^ (rng.random() < 0.06)) for i in range(n)}
        alarms += mcnemar(a, b).p < paired.ALPHA_GSM8K / 2
    assert alarms / runs <= _allowance(paired.ALPHA_GSM8K / 2, runs)


def test_mcnemar_finds_a_ten_point_drop_at_250_questions():
    rng = np.random.default_rng(12)
    n, hits = 250, 0
    for _ in range(50):
        a = {i: int(rng.random() < 0.60) for i in range(n)}
        b = {i: int(a[i] and rng.random() > 1 / 6) for i in range(n)}  # 10 points fewer, all one way
        hits += mcnemar(a, b).p < paired.ALPHA_GSM8K / 2
    assert hits == 50


def test_needed_questions_has_the_exact_minimum_and_grows_with_discordance():
    assert needed_questions(0.0, detect=1.0) == stats.exact_min_n(paired.ALPHA_GSM8K / 2) == 9
    assert needed_questions(0.0, detect=0.05) >= 9 / 0.05
    assert needed_questions(0.2, detect=0.05) > needed_questions(0.06, detect=0.05)
    # the H200's 16 of 250 differing responses, taken as discordance: 5 points need 338 questions, within
    # the cap of four times 250 that the run then uses
    assert needed_questions(16 / 250, detect=0.05) == 338


def test_detectable_difference_inverts_needed_questions():
    for psi in (0.0, 0.064, 0.2):
        d = paired.detectable_difference(psi, 250)
        assert needed_questions(psi, detect=d) <= 250 < needed_questions(psi, detect=d * 0.98)
    assert paired.detectable_difference(0.0, 5) == math.inf
