"""The A/B verdict rule (moegate/ab/rule.py, moegate/ab/verdict.py): one look's decision, the shares of alpha
over levels and looks, how looks settle a run, and a run's verdict with its faults.

Deterministic: the decisions are checked on figures whose interval is computed here from scipy's quantiles,
not on random draws. What the rule does over thousands of simulated runs: ``tests/unit/ab/test_rule_simulated.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from moegate.ab import rule
from moegate.ab.verdict import EQUIVALENT, FAIL, IMPROVED, PENDING, REGRESSED, UNRESOLVED, judge
from tests.support.ab import StubBench, StubServer, make_driver, reset_stubs, tok_s  # noqa: F401 (autouse)

L5 = math.log(1.05)


# --- one look ---------------------------------------------------------------------------------


def test_an_interval_inside_the_margin_is_equivalent_and_its_bounds_are_welchs():
    base, pr = [0.000, 0.010, 0.020], [0.005, 0.015, 0.025]
    got = rule.decide(base, pr, 0.01, 0.05)
    se = math.sqrt(np.var(base, ddof=1) / 3 + np.var(pr, ddof=1) / 3)
    half = stats.t.ppf(1 - 0.005, 4) * se  # equal spreads: Welch's df is 2n - 2
    assert float(got["df"]) == pytest.approx(4.0)
    assert (float(got["lo"]), float(got["hi"])) == pytest.approx((0.005 - half, 0.005 + half))
    assert int(got["code"]) == rule.EQUIVALENT and float(got["hi"]) < L5


def test_an_interval_below_one_and_past_the_margin_is_improved_and_the_mirror_is_regressed():
    base, pr = [0.000, 0.004, 0.008], [-0.100, -0.096, -0.092]  # the PR decodes 10 % faster
    assert int(rule.decide(base, pr, 0.01, 0.05)["code"]) == rule.IMPROVED
    assert int(rule.decide(pr, base, 0.01, 0.05)["code"]) == rule.REGRESSED


def test_a_significant_change_inside_the_margin_is_equivalent_not_improved():
    """2 % faster and tightly measured: the interval excludes 1 but lies within ±5 %: no change of 5 %."""
    got = rule.decide([0.0, 0.001, 0.002], [-0.020, -0.019, -0.018], 0.01, 0.05)
    assert float(got["hi"]) < 0 and int(got["code"]) == rule.EQUIVALENT


def test_an_interval_holding_one_and_reaching_past_the_margin_is_unresolved():
    assert int(rule.decide([0.0, 0.05, 0.10], [0.02, 0.07, 0.12], 0.01, 0.05)["code"]) == rule.UNRESOLVED


def test_zero_spread_is_equivalent_when_equal_and_unresolved_when_not():
    assert int(rule.decide([0.1, 0.1], [0.1, 0.1], 0.01, 0.05)["code"]) == rule.EQUIVALENT
    assert int(rule.decide([0.1, 0.1], [0.3, 0.3], 0.01, 0.05)["code"]) == rule.UNRESOLVED


def test_a_look_needs_two_starts_a_build_and_finite_figures():
    with pytest.raises(ValueError, match=">= 2 starts a build"):
        rule.decide([0.1], [0.1, 0.2], 0.01, 0.05)
    with pytest.raises(ValueError, match="finite"):
        rule.decide([0.1, math.nan], [0.1, 0.2], 0.01, 0.05)


@given(
    st.lists(st.floats(-0.5, 0.5), min_size=2, max_size=6),
    st.lists(st.floats(-0.5, 0.5), min_size=2, max_size=6),
)
def test_swapping_the_builds_mirrors_the_decision(base, pr):
    a, b = rule.decide(base, pr, 0.01, 0.05), rule.decide(pr, base, 0.01, 0.05)
    mirror = {rule.IMPROVED: rule.REGRESSED, rule.REGRESSED: rule.IMPROVED}
    assert int(b["code"]) == mirror.get(int(a["code"]), int(a["code"]))


def test_decide_works_on_a_batch_of_runs_as_on_one():
    rng = np.random.default_rng(1)
    base, pr = rng.normal(0, 0.01, (50, 2, 4)), rng.normal(0.03, 0.01, (50, 2, 4))
    batch = rule.decide(base, pr, 0.01, 0.05)["code"]
    one = [[int(rule.decide(base[i, j], pr[i, j], 0.01, 0.05)["code"]) for j in range(2)] for i in range(50)]
    assert batch.tolist() == one


# --- shares of alpha, looks --------------------------------------------------------------------


def test_the_first_look_spends_half_of_alpha_and_the_shares_sum_to_alpha():
    shares = rule.look_alphas(0.05, 5, 3, 5)
    assert shares == pytest.approx([0.05 * 0.5 / 5, 0.05 * 0.25 / 5, 0.05 * 0.25 / 5])
    assert sum(shares) * 5 == pytest.approx(0.05)
    assert rule.look_alphas(0.05, 5, 3, 3) == pytest.approx([0.01])
    with pytest.raises(ValueError):
        rule.look_alphas(0.05, 5, 1, 3)  # no look before two starts a build


def test_a_level_is_settled_by_the_first_look_that_resolves_it_and_the_run_stops_when_all_are():
    U, E, I = rule.UNRESOLVED, rule.EQUIVALENT, rule.IMPROVED
    final, at, stop = rule.settle(np.array([[U, I], [E, U], [U, U]]))  # looks x levels
    assert final.tolist() == [E, I] and at.tolist() == [1, 0] and int(stop) == 1
    final, at, stop = rule.settle(np.array([[U, I], [U, U], [U, I]]))
    assert final.tolist() == [U, I] and at.tolist() == [2, 0] and int(stop) == 2


def test_resolvable_shrinks_with_starts_and_grows_with_spread():
    a = rule.look_alphas(0.05, 5, 3, 5)[0]
    assert rule.resolvable(0.01, 3, a) > rule.resolvable(0.01, 6, a) > 0
    assert rule.resolvable(0.02, 3, a) > rule.resolvable(0.01, 3, a)
    assert rule.resolvable(0.0, 3, a) == 0.0 and math.isinf(rule.resolvable(0.01, 1, a))
    assert math.isinf(rule.resolvable(1.3, 2, 0.001 / 3))  # the CPU smoke's wide spread at 2 starts: no overflow
    assert rule.starts_needed(0.003, 0.05, a) <= 3 < rule.starts_needed(0.03, 0.05, a)


# --- a run's verdict -----------------------------------------------------------------------------


def test_a_run_that_settles_at_its_first_look_states_the_verdicts_and_the_starts_they_took(tmp_path):
    run = make_driver(tmp_path, StubBench(tok_s), starts=5).run()
    assert len(run.starts) == 6  # settled after 3 rounds: rounds 4 and 5 never ran
    v = judge(run, tmp_path / "run")
    assert v.state == "settled" and [lv.verdict for lv in v.levels] == [EQUIVALENT, IMPROVED, IMPROVED]
    assert all(lv.at == 3 and lv.used == (3, 3) for lv in v.levels)
    c2 = v.level(2)
    assert c2.speedup == pytest.approx(0.2, abs=0.01) and c2.speedup_ci is not None and c2.speedup_ci[0] > 0.05
    assert c2.tok_s_change == pytest.approx(0.10, abs=0.01)  # reported beside it, not judged
    assert v.gate_passed


def test_a_slower_pr_is_regressed_and_fails_the_gate_above_its_threshold(tmp_path):
    slower = StubBench(
        tok_s, decode=lambda label, c, server: 10.0 * (1.1 if label == "pr" else 1.0) * (1 + 0.001 * server)
    )
    run = make_driver(tmp_path, slower, starts=3).run()
    v = judge(run, tmp_path / "run")
    assert all(lv.verdict == REGRESSED for lv in v.levels)
    assert not v.gate_passed and "decode time +10" in v.gate_failures[0]
    assert judge(run, tmp_path / "run", gate_threshold=0.2).gate_passed  # 10 % is below a 20 % threshold


def test_a_level_that_never_resolves_is_unresolved_at_the_cap_with_what_it_rules_out(tmp_path):
    noisy = StubBench(tok_s, decode=lambda label, c, server: 10.0 * (1.0 + 0.2 * (server % 3)))
    run = make_driver(tmp_path, noisy, starts=4).run()
    assert len(run.starts) == 8
    v = judge(run, tmp_path / "run")
    assert v.state == "cap" and all(lv.verdict == UNRESOLVED for lv in v.levels)
    lv = v.level(1)
    assert lv.at == 4 and "rules out a slow-down of more than" in lv.reason and "resolves changes" in lv.reason
    assert v.gate_passed  # unresolved passes the gate; the report states it
    assert [look.starts for look in v.looks] == [3, 4]


def test_a_build_without_a_good_start_ends_fail_with_that_starts_log_tail(tmp_path):
    """Every PR server fails to come up: the run stops at its first look, and every level is FAIL, naming
    the failed starts and keeping their log tails: nothing is dropped silently."""
    StubServer.fail_on = {1, 2, 5}
    run = make_driver(tmp_path, StubBench(tok_s), starts=5).run()
    assert len(run.starts) == 6  # stopped at the first look: more rounds cannot give the PR a spread
    v = judge(run, tmp_path / "run")
    assert v.state == "no good start"
    for lv in v.levels:
        assert lv.verdict == FAIL and "base 3, PR 0" in lv.reason and "ServerError" in lv.reason
        assert [f["start"] for f in lv.failed_starts] == [2, 3, 6]
        assert "server 1 of pr" in lv.failed_starts[0]["log_tail"]
    assert not v.gate_passed and "FAIL" in v.gate_failures[0]


def test_an_interval_past_the_largest_float_stays_a_number(tmp_path):
    """The base's two starts 20x apart, the PR's alike, at a small share of alpha: one Welch degree of freedom,
    the interval's upper bound on the log scale passes 709 (the CPU smoke met it); the level is unresolved, its
    bound the largest float."""
    wide = StubBench(tok_s, decode=lambda label, c, server: {0: 1.0, 1: 10.0, 2: 10.001, 3: math.exp(3)}[server])
    d = make_driver(tmp_path, wide, starts=2, levels=(1,), alpha=0.001)
    v = judge(d.run(), tmp_path / "run")
    lv = v.level(1)
    assert lv.verdict == UNRESOLVED and lv.ci is not None and math.isfinite(lv.ci[1]) and lv.ci[1] > 1e300
    assert "rules nothing out" in lv.reason


def test_a_run_not_over_is_pending_where_unsettled_and_does_not_pass_the_gate(tmp_path):
    d = make_driver(tmp_path, StubBench(tok_s), starts=5)
    d.max_new_starts = 4
    run = d.run()
    v = judge(run, tmp_path / "run")
    assert v.state == "in progress" and not v.looks
    assert all(lv.verdict == PENDING and "after round 3" in lv.reason for lv in v.levels)
    assert not v.gate_passed and "not over" in v.gate_failures[-1]
