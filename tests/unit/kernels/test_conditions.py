"""The reference's conditions: each can be left out, each matters only where a case makes it, and the kernel
tier's strategies draw cases that make every one matter (CPU, torch alone).

"Matters" is the tier's own question (``moegate.kernels.conditions``): would the result without the condition
fail the comparison with the reference? The last tests draw the kernel tier's strategies as the tier does, on
small shapes (what makes a condition matter is the inputs' scale and the case's options, not its size), and
hold every condition a draw applies to one draw of the same activation where it matters.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from moegate.core.activation import Activation
from moegate.core.case import ExpertMap, MoECase, Quant
from moegate.core.index_width import INT32_LIMIT, kernel_extent
from moegate.kernels import activations, conditions
from moegate.kernels import reference as ref
from moegate.kernels.check import reference_for
from moegate.kernels.inputs import WeightBank
from moegate.strategies.kernels import biased_quant_cases, census_kernel_cases, kernel_cases

BANK = WeightBank(torch.device("cpu"), lambda w: w)


def small(case: MoECase) -> MoECase:
    """8 experts, hidden 256, intermediate 128: every wNa16 group size divides both."""
    return dataclasses.replace(case, num_experts=8, hidden=256, intermediate=128)


def matters(case: MoECase, block_k: tuple[int, int] | None = None) -> dict[str, bool]:
    t, _, _ = BANK.inputs(case)
    return conditions.mattered(case, t, block_k)


def test_every_condition_left_out_changes_the_reference_where_it_binds():
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(64, 8, generator=gen) * 8
    for act, cond in [
        (Activation("silu", limit=7.0), activations.GATE_CLAMP),
        (Activation("silu", limit=7.0), activations.UP_CLAMP),
        (Activation("swiglustep"), activations.STEP_CLAMP),
        (Activation("situ", situ_beta=1.0, situ_linear_beta=2.0), activations.SITU_GATE),
        (Activation("situ", situ_beta=1.0, situ_linear_beta=2.0), activations.SITU_UP),
        (Activation("swigluoai"), activations.SWIGLU_ALPHA),
        (Activation("swigluoai"), activations.SWIGLU_BETA),
    ]:
        assert cond in activations.conditions(act)
        with_it, without = activations.apply(h / 8, act), activations.apply(h / 8, act, frozenset({cond}))
        binding_scale = activations.apply(h, act) - activations.apply(h, act, frozenset({cond}))
        assert (with_it - without).abs().max() > 0 or binding_scale.abs().max() > 0, (act.label, cond)
        assert binding_scale.abs().max() > 0.1, (act.label, cond)


def test_an_unknown_condition_is_refused():
    with pytest.raises(ValueError, match="no activation condition"):
        activations.apply(torch.zeros(1, 2), Activation(), frozenset({"nope"}))
    case = MoECase(1, 1, 4, hidden=8, intermediate=8)
    t, _, _ = BANK.inputs(case)
    with pytest.raises(ValueError, match="no reference condition"):
        ref.reference_moe(t.hidden_states, t.w1, t.w2, t.topk_weights, t.topk_ids, without=frozenset({"nope"}))
    with pytest.raises(ValueError, match="k_blocks"):
        ref.reference_moe(t.hidden_states, t.w1, t.w2, t.topk_weights, t.topk_ids, without=frozenset({ref.K_TAIL}))


def test_a_clamp_no_input_reaches_does_not_matter_and_one_that_binds_does():
    loose = MoECase(2, 2, 8, hidden=64, intermediate=32, activation=Activation("silu", limit=10.0))
    # the bank scales even tokens by 8 for a clamping activation; at unit scale nothing reaches 1000
    assert matters(loose)[activations.GATE_CLAMP]
    t, _, _ = BANK.inputs(loose)
    t.hidden_states = t.hidden_states / 1000  # now no input is anywhere near the limit
    assert not conditions.mattered(loose, t)[activations.GATE_CLAMP]


def test_a_zero_bias_does_not_matter_and_a_drawn_one_does():
    case = MoECase(3, 2, 8, hidden=64, intermediate=32, bias=True)
    assert matters(case)[ref.W13_BIAS] and matters(case)[ref.W2_BIAS]
    t, _, _ = BANK.inputs(case)
    assert t.w1_bias is not None and t.w2_bias is not None
    t.w1_bias, t.w2_bias = torch.zeros_like(t.w1_bias), torch.zeros_like(t.w2_bias)
    seen = conditions.mattered(case, t)
    assert not seen[ref.W13_BIAS] and not seen[ref.W2_BIAS]


def test_the_router_weight_on_the_input_matters_once_top1_weights_are_not_renormalised():
    """A renormalised top-1 weight is exactly 1: weighting the input or the output would be the same call."""
    case = MoECase(4, 1, 8, hidden=64, intermediate=32, apply_router_weight_on_input=True)
    assert all(row[0] != 1.0 for row in case.topk_weights())
    assert matters(case)[ref.ON_INPUT]
    t, _, _ = BANK.inputs(case)
    t.topk_weights = torch.ones_like(t.topk_weights)
    assert not conditions.mattered(case, t)[ref.ON_INPUT]


def test_the_expert_map_matters_off_rank_zero_and_the_zero_point_for_grouped_wna16():
    mapped = MoECase(4, 2, 16, hidden=64, intermediate=32, expert_map=ExpertMap(2, 1))
    assert matters(mapped)[ref.EXPERT_MAP]
    grouped = MoECase(4, 2, 8, hidden=128, intermediate=64, quant=Quant("int4_w4a16", 32), dtype="bfloat16")
    assert matters(grouped)[ref.ZERO_POINT]


def test_the_k_tail_applies_only_where_the_block_leaves_one_and_then_matters():
    case = MoECase(3, 2, 8, hidden=96, intermediate=64)  # 96 = 64 + 32: a tail under a 64-wide K block
    assert ref.K_TAIL not in conditions.applicable(case, (32, 32))
    assert matters(case, (64, 64))[ref.K_TAIL]


def test_the_64_bit_row_index_matters_only_past_the_boundary():
    inter = 2**28  # w13 rows of 2**29: the boundary at 4 pairs; no tensor of that size is built
    before, past = (MoECase(n, 1, 2, hidden=8, intermediate=inter) for n in (4, 5))
    assert kernel_extent(before) <= INT32_LIMIT < kernel_extent(past)
    assert conditions.INDEX_BOUNDARY not in conditions.applicable(before)
    t, _, _ = BANK.inputs(MoECase(5, 1, 2, hidden=8, intermediate=8))  # the tokens' values; the geometry is past's
    assert conditions._index_boundary_matters(past, t)
    t.hidden_states[4:] = 0.0  # the one token past the boundary now outputs nothing: nowhere to be wrong
    assert not conditions._index_boundary_matters(past, t)


def test_the_tally_counts_and_keeps_the_first_case_that_mattered():
    tally = conditions.Tally()
    case = MoECase(2, 2, 8, hidden=64, intermediate=32, bias=True)
    t, _, _ = BANK.inputs(case)
    result = type("R", (), {"case": case, "entrypoint": "legacy", "tensors": t, "block_k": None})()
    tally.observe(result)
    tally.observe(result)
    counts = tally.to_dict()["counts"]
    assert counts[ref.W13_BIAS]["applied"] == 2 and counts[ref.W13_BIAS]["mattered"] == 2
    assert counts[ref.W13_BIAS]["example"]["case"] == case.to_dict()
    assert counts[ref.ON_INPUT] == {"applied": 0, "mattered": 0, "example": None}
    assert reference_for(case, t).output.shape == (2, 64)


DRAWS = 150
STRATEGIES = {
    "kernel properties (legacy)": kernel_cases("legacy", expert_map=None, quant=None, schemes="wna16"),
    "expert parallelism (modular)": kernel_cases("modular", expert_map=True),
    "host-resident (legacy)": kernel_cases("legacy", expert_map=False),
    "census (legacy)": census_kernel_cases("legacy"),
    "census (modular)": census_kernel_cases("modular"),
    "biased quantized (legacy)": biased_quant_cases("legacy", fp8=False),
}
"""The kernel tier's strategies, as its tests draw them (tests/kernels/)."""


def draws(strategy: st.SearchStrategy[MoECase]) -> list[MoECase]:
    """``DRAWS`` cases as Hypothesis generates them for ``strategy`` (the same ones on every run)."""
    drawn: list[MoECase] = []

    @settings(max_examples=DRAWS, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), deadline=None)  # fmt: skip
    @given(case=strategy)
    def collect(case: MoECase) -> None:
        drawn.append(case)

    collect()
    return drawn


@functools.cache
def seen_in_draws() -> dict[tuple[str, str], list[int]]:
    """Per (activation, condition): in how many of the strategies' draws it applied, and in how many it mattered."""
    counts: dict[tuple[str, str], list[int]] = {}
    for strategy in STRATEGIES.values():
        for case in draws(strategy):
            for name, hit in matters(small(case)).items():
                count = counts.setdefault((case.activation.name, name), [0, 0])
                count[0] += 1
                count[1] += int(hit)
    return counts


MEASURED_ON_GPU = (ref.K_TAIL, conditions.INDEX_BOUNDARY)
"""Conditions that need the GPU's launches (the block sizes) or 10 GiB: the reach report measures them there."""


@pytest.mark.parametrize("condition", [c for c in conditions.CONDITIONS if c not in MEASURED_ON_GPU])
def test_the_kernel_tiers_strategies_apply_every_condition(condition):
    """Every condition the reference implements is part of some draw (the uninterleaved form's beta: drawn as 1.0)."""
    assert any(c == condition for _, c in seen_in_draws()), f"no draw of the kernel tier's strategies has {condition!r}"


def test_every_condition_a_draw_applies_matters_in_some_draw_of_the_same_activation():
    """Per activation: a condition drawn only where it cannot change the result would be code run without a test.

    Before the per-token input gains and unit-scale biases, swigluoai's alpha mattered in none of its 31 draws
    here (every gate scaled by 8 saturates the sigmoid), nor the router weight on the input in any of its 27
    (a renormalised top-1 weight is exactly 1)."""
    never = sorted(f"{act}: {cond} ({n} draws)" for (act, cond), (n, hit) in seen_in_draws().items() if not hit)
    assert not never, "drawn, but never mattered: " + "; ".join(never)
