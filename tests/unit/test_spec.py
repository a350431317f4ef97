"""The executable spec against the rule as docs/spec.md states it: examples first, then properties."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moegate.case import ALL_PLACEMENTS, ENTRYPOINTS, DispatchPath, ExpertMap, MoECase, Placement, Quant
from moegate.spec import expected_path, experts_counted, in_naive_region
from strategies import moe_cases

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


@given(case=moe_cases(), entrypoint=st.sampled_from(ENTRYPOINTS))
def test_host_resident_is_always_sorted(case, entrypoint):
    if case.placement.host_resident:
        assert expected_path(case, entrypoint).path is DispatchPath.SORTED


@given(case=moe_cases(), entrypoint=st.sampled_from(ENTRYPOINTS))
def test_naive_exactly_in_region_for_plain_device_weights(case, entrypoint):
    device_case = replace(case, placement=DEVICE)
    naive = expected_path(device_case, entrypoint).path is DispatchPath.NAIVE
    assert naive == in_naive_region(device_case, entrypoint)


@given(case=moe_cases(), extra=st.integers(1, 64))
def test_more_tokens_never_turn_sorted_into_naive(case, extra):
    bigger = replace(case, num_tokens=case.num_tokens + extra)
    if expected_path(case, "legacy").path is DispatchPath.SORTED:
        assert expected_path(bigger, "legacy").path is DispatchPath.SORTED


@given(case=moe_cases(), entrypoint=st.sampled_from(ENTRYPOINTS))
def test_new_rule_differs_from_base_only_on_host_resident_naive_region_cases(case, entrypoint):
    new = expected_path(case, entrypoint).path
    old = expected_path(case, entrypoint, host_rule=False).path
    if new is not old:
        assert case.placement.host_resident and in_naive_region(case, entrypoint)
        assert (old, new) == (DispatchPath.NAIVE, DispatchPath.SORTED)


@given(case=moe_cases(expert_map=True, quant=None, placement=Placement()))
def test_expert_map_always_sorted(case):
    assert all(expected_path(case, ep).path is DispatchPath.SORTED for ep in ENTRYPOINTS)


@given(case=moe_cases(quant=True, schemes="wna16", group=True))
def test_grouped_wna16_always_sorted(case):
    assert all(expected_path(case, ep).path is DispatchPath.SORTED for ep in ENTRYPOINTS)
