"""The executable spec against the rule as docs/spec.md states it: examples first, then properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moegate.core.case import ALL_PLACEMENTS, ENTRYPOINTS, DispatchPath, ExpertMap, MoECase, Placement, Quant
from moegate.core.spec import CLAUSES, Decision, expected_path, experts_counted, in_naive_region
from moegate.strategies import moe_cases

DEVICE, W13, W2, BOTH = ALL_PLACEMENTS


@pytest.mark.parametrize(
    ("placement", "want"),
    [(DEVICE, DispatchPath.NAIVE), (W13, DispatchPath.SORTED), (W2, DispatchPath.SORTED), (BOTH, DispatchPath.SORTED)],
)
@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
def test_design_probe_case(placement, want, entrypoint):
    """The measured probe of docs/spec.md: 2 tokens, 64 experts, top-2 on vLLM 0.33.0."""
    case = MoECase(num_tokens=2, top_k=2, num_experts=64, placement=placement)
    assert expected_path(case, entrypoint).path is want


@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "want"),
    [
        (2, 8, 64, DispatchPath.NAIVE),  # 64 <= 64: the threshold itself is naive
        (2, 8, 63, DispatchPath.SORTED),
        (4, 8, 128, DispatchPath.NAIVE),  # Qwen3-30B-A3B at 4 in flight, the PR's "up to 4 tokens"
        (5, 8, 128, DispatchPath.SORTED),
        (1, 1, 4, DispatchPath.NAIVE),
        (1, 1, 3, DispatchPath.SORTED),
    ],
)
def test_threshold_for_device_weights(tokens, top_k, experts, want):
    case = MoECase(num_tokens=tokens, top_k=top_k, num_experts=experts)
    assert expected_path(case, "legacy").path is want


def test_base_rule_ignores_residency():
    case = MoECase(num_tokens=1, top_k=2, num_experts=64, placement=W13)
    assert expected_path(case, "legacy", host_rule=False).path is DispatchPath.NAIVE
    assert expected_path(case, "legacy").path is DispatchPath.SORTED


def test_modular_wna16_always_aligns_but_legacy_per_channel_may_not():
    case = MoECase(num_tokens=1, top_k=1, num_experts=64, quant=Quant("int8_w8a16", 0))
    assert expected_path(case, "legacy").path is DispatchPath.NAIVE
    assert expected_path(case, "modular").path is DispatchPath.SORTED


@pytest.mark.parametrize("group", [0, 128])
def test_fp8_follows_the_unquantized_rule_even_with_blocks(group):
    device = MoECase(num_tokens=1, top_k=2, num_experts=64, quant=Quant("fp8_w8a8", group))
    host = replace(device, placement=W13)
    for ep in ENTRYPOINTS:
        assert expected_path(device, ep).path is DispatchPath.NAIVE
        assert expected_path(host, ep).path is DispatchPath.SORTED


def test_unknown_quant_scheme_is_rejected():
    with pytest.raises(ValueError, match="unknown quantization scheme"):
        Quant("int2_w2a16", 0)


def test_modular_counts_local_experts_only_without_expert_map():
    with_map = MoECase(num_tokens=1, top_k=1, num_experts=64, expert_map=ExpertMap(4, 1))
    assert experts_counted(with_map, "modular") == 64
    assert with_map.local_experts == 16
    assert experts_counted(MoECase(num_tokens=1, top_k=1, num_experts=64), "modular") == 64


def test_unknown_entrypoint_is_rejected():
    with pytest.raises(ValueError, match="unknown entrypoint"):
        expected_path(MoECase(num_tokens=1, top_k=1, num_experts=8), "marlin")


@given(case=moe_cases(shared=None), entrypoint=st.sampled_from(ENTRYPOINTS))
def test_host_resident_is_always_sorted(case, entrypoint):
    if case.placement.host_resident:
        assert expected_path(case, entrypoint).path is DispatchPath.SORTED


@given(case=moe_cases(shared=None), entrypoint=st.sampled_from(ENTRYPOINTS))
def test_naive_exactly_in_region_for_plain_device_weights(case, entrypoint):
    device_case = replace(case, placement=DEVICE)
    naive = expected_path(device_case, entrypoint).path is DispatchPath.NAIVE
    assert naive == in_naive_region(device_case, entrypoint)


@given(case=moe_cases(shared=None), extra=st.integers(1, 64))
def test_more_tokens_never_turn_sorted_into_naive(case, extra):
    bigger = replace(case, num_tokens=case.num_tokens + extra)
    if expected_path(case, "legacy").path is DispatchPath.SORTED:
        assert expected_path(bigger, "legacy").path is DispatchPath.SORTED


@given(case=moe_cases(shared=None), entrypoint=st.sampled_from(ENTRYPOINTS))
def test_new_rule_differs_from_base_only_on_host_resident_naive_region_cases(case, entrypoint):
    new = expected_path(case, entrypoint).path
    old = expected_path(case, entrypoint, host_rule=False).path
    if new is not old:
        assert case.placement.host_resident and in_naive_region(case, entrypoint)
        assert (old, new) == (DispatchPath.NAIVE, DispatchPath.SORTED)


@given(case=moe_cases(expert_map=True, quant=None, placement=Placement(), shared=None))
def test_expert_map_always_sorted(case):
    assert all(expected_path(case, ep).path is DispatchPath.SORTED for ep in ENTRYPOINTS)


@given(case=moe_cases(quant=True, schemes="wna16", group=True))
def test_grouped_wna16_always_sorted(case):
    assert all(expected_path(case, ep).path is DispatchPath.SORTED for ep in ENTRYPOINTS)


# --- fused shared-expert rows -------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "top_k", "experts", "shared", "want", "reason"),
    [
        (1, 1, 7, 1, DispatchPath.NAIVE, "naive region: 1*(1+1)*4=8 <= 8"),  # the shared row counts as an expert
        (1, 1, 6, 1, DispatchPath.SORTED, "outside naive region: 1*(1+1)*4=8 > 7"),  # and its slot as a top-k id
        (7, 8, 256, 1, DispatchPath.NAIVE, "naive region: 7*(8+1)*4=252 <= 257"),  # DeepSeek-V3 at 7 tokens
        (8, 8, 256, 1, DispatchPath.SORTED, "outside naive region: 8*(8+1)*4=288 > 257"),
        (2, 6, 64, 2, DispatchPath.NAIVE, "naive region: 2*(6+2)*4=64 <= 66"),  # DeepSeek-V2-Lite
    ],
)
@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
def test_threshold_with_shared_rows(tokens, top_k, experts, shared, want, reason, entrypoint):
    case = MoECase(num_tokens=tokens, top_k=top_k, num_experts=experts, shared_experts=shared)
    clause = "naive" if want is DispatchPath.NAIVE else "outside-naive"
    assert expected_path(case, entrypoint) == Decision(want, reason, clause)


def test_a_fused_shared_expert_moves_deepseek_v3_out_of_the_naive_region_at_8_tokens():
    plain = MoECase(num_tokens=8, top_k=8, num_experts=256)
    fused = MoECase(num_tokens=8, top_k=8, num_experts=256, shared_experts=1)
    assert expected_path(plain, "modular").path is DispatchPath.NAIVE  # 256 <= 256
    assert expected_path(fused, "modular").path is DispatchPath.SORTED  # 288 > 257


@pytest.mark.parametrize("placement", [W13, W2, BOTH], ids=lambda p: p.label)
@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
def test_host_resident_shared_rows_are_sorted_and_the_base_rule_is_not(placement, entrypoint):
    case = MoECase(num_tokens=1, top_k=1, num_experts=7, shared_experts=1, placement=placement)
    assert expected_path(case, entrypoint) == Decision(
        DispatchPath.SORTED, f"host-resident weights ({placement.label})", "host-resident"
    )
    assert expected_path(case, entrypoint, host_rule=False).path is DispatchPath.NAIVE


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
def test_shared_rows_are_counted_with_and_without_an_expert_map(entrypoint):
    plain = MoECase(num_tokens=1, top_k=1, num_experts=64, shared_experts=2)
    ep = MoECase(num_tokens=1, top_k=1, num_experts=64, shared_experts=2, expert_map=ExpertMap(4, 1))
    assert experts_counted(plain, entrypoint) == 66 == plain.local_experts
    assert experts_counted(ep, entrypoint) == 66  # the global id space the map covers
    assert ep.local_experts == 16 + 2  # this rank's routed experts and both shared rows
    assert expected_path(ep, entrypoint) == Decision(
        DispatchPath.SORTED, "expert map given (expert parallelism)", "expert-map"
    )


@given(case=moe_cases(shared=True, expert_map=None, quant=None), entrypoint=st.sampled_from(ENTRYPOINTS))
def test_shared_rows_decide_as_that_many_more_routed_experts(case, entrypoint):
    """The rule sees a shared row as one more expert every token picks: same path as the plain case so widened."""
    widened = MoECase.from_dict(
        {
            **{k: v for k, v in case.to_dict().items() if k != "shared_experts"},
            "top_k": case.top_k + case.shared_experts,
            "num_experts": case.num_experts + case.shared_experts,
            "apply_router_weight_on_input": False,
        }
    )
    assert expected_path(case, entrypoint).path is expected_path(widened, entrypoint).path
    assert experts_counted(case, entrypoint) == experts_counted(widened, entrypoint)


@given(case=moe_cases(shared=True), entrypoint=st.sampled_from(ENTRYPOINTS))
def test_every_decision_names_a_clause_the_golden_header_spells_out(case, entrypoint):
    assert expected_path(case, entrypoint).clause in CLAUSES
