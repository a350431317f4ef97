"""The aggregate check of ``moegate.kernels.systematic`` against a kernel's own rounding, simulated on a CPU.

The "kernel" is ``tests.support.systematic.kernel_output``: the layer computed in
bfloat16, float16 or float32 (TF32 operands) with torch, rounded where vLLM's
Triton experts round. Its calls are drawn once per module (weights from the
kernel tier's ``WeightBank``), clean and with a planted relative error, and the
runs below are drawn from them: random group labels, random subsets.
"""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
from scipy import stats

from moegate.core.case import ALL_PLACEMENTS, ENTRYPOINTS, MoECase, Routing
from moegate.kernels.check import OBSERVERS, KernelResult, run_checked
from moegate.kernels.inputs import WeightBank
from moegate.kernels.student_t import t_critical, t_two_sided
from moegate.kernels.systematic import (
    ALPHA,
    Collector,
    Sample,
    case_moments,
    sample_from,
    summarise,
    tf32,
)
from moegate.kernels.tally import Tally
from moegate.kernels.tolerance import Closeness
from tests.support.systematic import kernel_output, kernel_sum

CPU = torch.device("cpu")
SHAPES = ((16, 128, 256), (32, 256, 128))
"""Small kernel-tier shapes (multiples of 128): the CPU computes each call twice, clean and planted."""
PLANTED = 0.002
"""The issue's target: every output 0.2 % too large (or too small)."""
POOL = {"bfloat16": 64, "float16": 16, "float32": 16}
"""Calls per dtype: 8 per (entrypoint, placement) group in bfloat16, 2 in float16 and float32, fewer than the
``ci`` profile's kernel tier makes in all but its rarest groups (docs/design/kernels-systematic.md counts them)."""
GROUPS = [(ep, p.label) for ep in ENTRYPOINTS for p in ALL_PLACEMENTS]


def _case(rng: random.Random, dtype: str) -> MoECase:
    experts, hidden, inter = rng.choice(SHAPES)
    on_input = rng.random() < 0.1  # vLLM scales the input only for one expert a token
    return MoECase(
        num_tokens=rng.randint(1, 8),
        top_k=1 if on_input else rng.randint(1, 8),
        num_experts=experts,
        hidden=hidden,
        intermediate=inter,
        dtype=dtype,
        routing=Routing(seed=rng.randrange(2**31)),
        apply_router_weight_on_input=on_input,
    )


@dataclasses.dataclass
class Pool:
    clean: list[Sample]
    up: list[Sample]  # every output (1 + PLANTED) times the clean one, then rounded
    down: list[Sample]
    ieee: list[Sample]  # float32 only: full float32 products where the tensor cores take TF32


@pytest.fixture(scope="module")
def pools() -> dict[str, Pool]:
    """Each dtype's calls, spread over the eight groups in turn (the same calls in every run below)."""
    rng = random.Random(19)
    bank = WeightBank(CPU, lambda w: w.clone())
    out: dict[str, Pool] = {}
    for dtype, n in POOL.items():
        pool = Pool([], [], [], [])
        for i in range(n):
            entrypoint, label = GROUPS[i % len(GROUPS)]
            case = dataclasses.replace(_case(rng, dtype), placement=ALL_PLACEMENTS[i % 4])
            assert case.placement.label == label
            t, _, _ = bank.inputs(case)
            moments = case_moments(t, case)
            assert moments is not None
            outputs = [(1.0, pool.clean), (1 + PLANTED, pool.up), (1 - PLANTED, pool.down)]
            for scale, kept in outputs:
                s = sample_from(case, entrypoint, dtype, moments.estimate(kernel_output(case, t, scale)), moments.scale)
                assert s is not None
                kept.append(s)
            if dtype == "float32":
                ieee = kernel_sum(case, t, operands_tf32=False)
                s = sample_from(case, entrypoint, dtype, moments.estimate(ieee), moments.scale)
                assert s is not None
                pool.ieee.append(s)
        out[dtype] = pool
    return out


def relabel(samples: list[Sample], rng: random.Random) -> list[Sample]:
    """The same calls in random groups (placement does not change an output: any labelling is a null run)."""
    out = []
    for s in samples:
        entrypoint, placement = rng.choice(GROUPS)
        out.append(dataclasses.replace(s, entrypoint=entrypoint, placement=placement, call=entrypoint + s.call))
    return out


# --- Student's t ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 30, 151, 1200])
def test_student_t_tail_and_critical_value_match_scipy(df):
    for t in (0.0, 0.3, 1.0, 2.5, 6.0, 40.0):
        assert t_two_sided(t, df) == pytest.approx(2 * stats.t.sf(t, df), rel=1e-9, abs=1e-14)
    for p in (0.1, 1e-3, 4e-5, 1e-7):
        assert t_critical(p, df) == pytest.approx(stats.t.isf(p / 2, df), rel=1e-7)


def test_student_t_refuses_no_degrees_of_freedom():
    with pytest.raises(ValueError, match="at least 1"):
        t_two_sided(1.0, 0)


# --- the model and the float32 operands ------------------------------------------------------------------


def test_tf32_keeps_ten_mantissa_bits_and_truncates_toward_zero():
    x = torch.tensor([1 + 2**-10 + 2**-11 + 2**-12, -(1 + 2**-11), 3.0, 2**-20 * (1 + 2**-9 + 2**-13)])
    assert tf32(x).tolist() == [1 + 2**-10, -1.0, 3.0, 2**-20 * (1 + 2**-9)]


def test_a_clean_kernels_cases_spread_as_the_rounding_model_says(pools):
    """In units of each case's model error the clean estimates have mean about 0 and a common spread near 1.

    The model counts each rounding as an independent error of variance u**2/3; round-to-nearest-even on
    values with a spread of mantissas does somewhat better (docs: kappa about 0.7-0.8 for 16-bit).
    """
    for dtype in ("bfloat16", "float16"):
        z = [s.estimate / s.scale for s in pools[dtype].clean]
        mean = sum(z) / len(z)
        sd = math.sqrt(sum((v - mean) ** 2 for v in z) / (len(z) - 1))
        assert abs(mean) < 4 * sd / math.sqrt(len(z)), (dtype, mean, sd)
        assert 0.4 < sd < 1.3, (dtype, sd)


# --- the null: a clean kernel passes at the stated rate -------------------------------------------------


def test_clean_kernel_runs_pass_at_the_stated_family_wise_rate(pools):
    """500 runs of a clean kernel (random groups and subsets of the pool): at most the rate's share alarm."""
    rng = random.Random(5)
    alarms = 0
    runs = 500
    for _ in range(runs):
        samples = []
        for pool in pools.values():
            samples += relabel(rng.sample(pool.clean, max(4, len(pool.clean) * 3 // 4)), rng)
        alarms += bool(summarise(samples).detected)
    # Binomial(500, 1e-3): P(more than 5) < 2e-5; with the margin the true rate is far below ALPHA
    assert alarms <= 5, f"{alarms} of {runs} clean runs alarmed at family-wise {ALPHA}"


def test_without_the_margin_the_interval_has_its_nominal_coverage_on_a_clean_kernel(pools):
    """The statistic itself, margin 0, one group a run: rejections at 10 % near 10 % (the t null holds)."""
    rng = random.Random(7)
    clean = pools["bfloat16"].clean + pools["float16"].clean
    runs, rejected = 400, 0
    for _ in range(runs):
        dtype = rng.choice(("bfloat16", "float16"))
        picked = rng.sample(pools[dtype].clean, 10)
        one = [dataclasses.replace(s, entrypoint="legacy", placement="device") for s in picked]
        rejected += bool(summarise(one, alpha=0.1, margin=0.0).detected)
    assert clean  # both pools drawn
    assert 0.04 * runs <= rejected <= 0.18 * runs, f"{rejected} of {runs} rejected at nominal 10 %"


# --- planted errors: detected at the ci profile's counts ------------------------------------------------


@pytest.mark.parametrize("direction", ["up", "down"])
def test_a_planted_relative_error_of_two_tenths_of_a_percent_is_detected_in_every_group(pools, direction):
    samples = [s for pool in pools.values() for s in getattr(pool, direction)]
    summary = summarise(samples)
    sign = 1 if direction == "up" else -1
    assert len(summary.groups) == 3 * len(GROUPS), summary.lines()
    missed = [g.line() for g in summary.groups if not g.detected]
    assert not missed, "\n".join(missed)
    for g in summary.groups:
        assert g.low <= sign * PLANTED <= g.high, g.line()  # and the interval covers the planted error


def test_the_clean_pool_itself_passes(pools):
    summary = summarise(s for pool in pools.values() for s in pool.clean)
    assert len(summary.groups) == 3 * len(GROUPS)
    assert not summary.detected, summary.failure_message()


def test_float32_with_ieee_products_reads_as_a_bias_against_the_tf32_reference(pools):
    """A change of the products' precision (TF32 to IEEE float32) is a systematic error of about +0.1 %.

    The same bias, with the other sign, is what a plain float32 reference would report on every correct
    float32 call: why ``case_moments`` truncates float32 operands as the tensor cores read them.
    """
    summary = summarise(pools["float32"].ieee)
    assert summary.detected and all(g.estimate > 5e-4 for g in summary.groups), summary.lines()


def test_a_bias_in_one_dtype_is_reported_in_that_family_only(pools):
    samples = pools["bfloat16"].clean + pools["float16"].up + pools["float32"].clean
    summary = summarise(samples)
    assert {g.family for g in summary.detected} == {"float16"}, summary.lines()


def test_the_failure_message_names_group_estimate_interval_cases_and_a_reproducer(pools):
    summary = summarise(pools["float16"].up)
    text = summary.failure_message()
    g = summary.detected[0]
    assert f"{g.entrypoint} {g.placement} float16: {g.cases} cases" in text
    assert f"{g.estimate:+.4%}" in text and f"[{g.low:+.4%}, {g.high:+.4%}]" in text
    repro = text.split("MoECase.from_json('", 1)[1].split("')", 1)[0]
    assert MoECase.from_json(repro).dtype == "float16"


def test_too_few_distinct_calls_leave_a_family_untested_and_say_so(pools):
    one = pools["float16"].clean[:1]
    summary = summarise(one)
    assert not summary.groups and summary.untested == {"float16": 1}
    assert "not tested" in "\n".join(summary.lines())


def test_the_same_call_run_twice_counts_once(pools):
    s = pools["bfloat16"].clean[:6]
    assert summarise(s + s).groups == summarise(s).groups


def test_bad_arguments_are_refused(pools):
    with pytest.raises(ValueError, match="alpha"):
        summarise(pools["float16"].clean, alpha=0)


# --- the hooks: run_checked's observers, the collector, the workers' tally --------------------------------


class _Target:
    """A stand-in for ``VllmTarget.run_placed``: the CPU kernel above, scaled."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def run_placed(self, case, entrypoint, t, w1, w2):
        return type("Obs", (), {"output": kernel_output(case, t, self.scale), "path": "sorted", "quantized": []})()


def _session(scale: float) -> Collector:
    collector = Collector()
    bank = WeightBank(CPU, lambda w: w.clone())
    rng = random.Random(3)
    OBSERVERS.append(collector.add)
    try:
        for i in range(8):
            case = dataclasses.replace(_case(rng, "float16"), placement=ALL_PLACEMENTS[0])
            run_checked(_Target(scale), bank, case, ENTRYPOINTS[i % 2])
    finally:
        OBSERVERS.remove(collector.add)
    return collector


def test_run_checked_hands_every_result_with_its_sample_to_the_session_collector():
    clean = _session(1.0)
    assert clean.calls == 8 and len(clean.samples) == 8
    assert not clean.summary().detected
    planted = _session(1 + PLANTED)
    assert {(g.entrypoint, g.family) for g in planted.summary().detected} == {
        ("legacy", "float16"),
        ("modular", "float16"),
    }


def test_the_workers_tally_carries_samples_through_merge(pools):
    a, b = Tally(), Tally()
    for tally, s in ((a, pools["float16"].up[0]), (b, pools["float16"].up[1])):
        case = MoECase.from_json(s.case)
        closeness = Closeness(0.0, 0.1, 0.0, True)
        tally.add(case, s.entrypoint, KernelResult(case, s.entrypoint, "sorted", torch.zeros(1), closeness, s))
    a.merge(b)
    assert a.samples == pools["float16"].up[:2]
