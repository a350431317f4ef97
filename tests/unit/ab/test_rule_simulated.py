"""The verdict rule over thousands of simulated runs (moegate/ab/simulate.py through rule.decide and rule.settle,
the functions the report applies): its false-verdict rate on A/A runs stays at or below alpha, and it resolves
5 % changes where the start-to-start spread allows.

The start effects are drawn like the H200's: each level's start-effect and request sd and requests a start
are taken from the committed runs' numbers (``results/ab-runs/ab-h200.tar.xz``,
``results/ab-runs/ab-text-h200.tar.xz``: vLLM 0.32.0 against 0.33.0 served with ``--enforce-eager``; they kept
vLLM's summary of each run's requests, not the requests, so requests are drawn normal with the measured sd). Seeds are
fixed, so every figure is the same on every run of the test; 4,000 runs a case put a rate's standard error
near 0.003 at 5 %. The full tables (20,000 runs a row): ``results/ab-decode-rule.md``.
"""

from __future__ import annotations

import math
import tarfile

import numpy as np
import pytest

from moegate.ab import rule
from moegate.ab.simulate import levels_like, simulate, uniform_levels
from moegate.paths import ROOT

RUNS = 4000
ALPHA = 0.05
FASTER = -math.log(1.05)


@pytest.fixture(scope="module")
def h200(tmp_path_factory):
    """Both committed H200 runs, unpacked: {name: simulation levels drawn like that run's}."""
    out = {}
    for name in ("ab-h200", "ab-text-h200"):
        where = tmp_path_factory.mktemp(name)
        with tarfile.open(ROOT / "results" / "ab-runs" / f"{name}.tar.xz") as tar:
            tar.extractall(where, filter="data")
        out[name] = levels_like(where / name)
    return out


@pytest.mark.parametrize("name", ["ab-h200", "ab-text-h200"])
@pytest.mark.parametrize("contamination", [0.0, 0.1], ids=["normal starts", "a tenth of starts 5x wider"])
def test_a_a_runs_drawn_like_the_h200s_state_a_false_verdict_at_most_alpha_of_the_time(h200, name, contamination):
    levels = h200[name]
    assert len(levels) == 5 and all(lv.start_sd + lv.request_sd > 0 for lv in levels)
    out = simulate(levels, [0.0] * 5, runs=RUNS, rng=np.random.default_rng(7), alpha=ALPHA, contamination=contamination)
    assert out.false_run_rate <= ALPHA
    assert out.false_regressed_rate <= ALPHA / 2  # what would fail the gate


@pytest.mark.parametrize("sd", [0.002, 0.01, 0.05, 0.3])
def test_a_a_runs_at_any_spread_state_a_false_verdict_at_most_alpha_of_the_time(sd):
    out = simulate(uniform_levels(sd), [0.0] * 5, runs=RUNS, rng=np.random.default_rng(11), alpha=ALPHA)
    assert out.false_run_rate <= ALPHA and out.false_regressed_rate <= ALPHA / 2


def test_a_single_look_a_plan_without_adaptive_rounds_also_keeps_alpha():
    out = simulate(uniform_levels(0.01), [0.0] * 5, runs=RUNS, rng=np.random.default_rng(3), first=3, cap=3)
    assert out.false_run_rate <= ALPHA


def test_at_a_start_to_start_sd_of_0_4_percent_5_percent_changes_resolve_in_3_starts_a_build():
    """The issue's target: at this spread every level resolves a 5 % change either way, and no change as
    equivalent within ±5 %, at the first look (3 starts a build) in at least 90 % of runs."""
    levels = uniform_levels(0.004)
    for shifts, code in (([FASTER] * 5, rule.IMPROVED), ([-FASTER] * 5, rule.REGRESSED), ([0.0] * 5, rule.EQUIVALENT)):
        out = simulate(levels, shifts, runs=RUNS, rng=np.random.default_rng(5))
        assert (out.share_by(code, 3) >= 0.9).all(), out.share_by(code, 3)


def test_at_1_percent_the_added_rounds_resolve_5_percent_by_the_cap_that_3_starts_do_not():
    out = simulate(uniform_levels(0.01), [FASTER] * 5, runs=RUNS, rng=np.random.default_rng(9))
    assert (out.share_by(rule.IMPROVED, 3) < 0.5).all()
    assert (out.share(rule.IMPROVED) >= 0.75).all()
    assert 3 < out.stopped_at.mean() <= 5


def test_on_the_h200s_eager_spreads_the_text_models_2_and_3_in_flight_resolve_and_1_in_flight_cannot(h200):
    """The measured reason the target fails under --enforce-eager: at 1 in flight the starts of one build
    differ by tens of percent (results/ab-decode-spread.md), and no cap of 5 starts resolves 5 % there."""
    out = simulate(h200["ab-text-h200"], [FASTER] * 5, runs=RUNS, rng=np.random.default_rng(13))
    share = out.share(rule.IMPROVED)
    assert share[1] >= 0.9 and share[2] >= 0.9  # 2 and 3 in flight
    assert share[0] <= 0.05  # 1 in flight
