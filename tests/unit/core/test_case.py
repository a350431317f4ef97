"""The case model: reproducers round-trip, invalid cases are refused with the reason."""

from __future__ import annotations

import pytest
from hypothesis import given

from moegate.core.case import SHARED_EXPERT_WEIGHT, ExpertMap, MoECase, Placement, Quant, Routing, RoutingKind
from moegate.strategies import moe_cases


@given(case=moe_cases())
def test_json_round_trip(case):
    assert MoECase.from_json(case.to_json()) == case


@given(case=moe_cases(expert_map=True, quant=True))
def test_json_round_trip_with_map_and_quant(case):
    assert MoECase.from_json(case.to_json()) == case


@given(case=moe_cases(shared=True, expert_map=None, quant=None))
def test_json_round_trip_with_shared_rows(case):
    assert case.shared_experts > 0 and MoECase.from_json(case.to_json()) == case


OLD_REPRODUCER = (
    '{"apply_router_weight_on_input":false,"dtype":"bfloat16","expert_map":{"ep_rank":1,"ep_size":2},'
    '"hidden":128,"intermediate":128,"num_experts":64,"num_tokens":2,"placement":{"w13_host":true,"w2_host":false},'
    '"quant":{"group_size":128,"scheme":"fp8_w8a8"},"routing":{"kind":"uniform","pool":0,"seed":0},"top_k":8}'
)
"""A reproducer printed before cases had shared rows (moegate at e290da7)."""


def test_cases_without_shared_rows_read_and_print_as_before():
    case = MoECase.from_json(OLD_REPRODUCER)
    assert case.shared_experts == 0
    assert case == MoECase(
        num_tokens=2,
        top_k=8,
        num_experts=64,
        placement=Placement(True, False),
        expert_map=ExpertMap(2, 1),
        quant=Quant("fp8_w8a8", 128),
    )
    assert case.to_json() == OLD_REPRODUCER
    assert "shared" not in case.short()


def test_shared_rows_appear_in_the_reproducer_and_the_short_form():
    case = MoECase(num_tokens=1, top_k=8, num_experts=256, shared_experts=1)
    assert '"shared_experts":1' in case.to_json()
    assert case.short() == "placement=device tokens=1 top_k=8 experts=256 shared=1"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_tokens": 0, "top_k": 1, "num_experts": 8}, "num_tokens=0"),
        ({"num_tokens": 1, "top_k": 9, "num_experts": 8}, "top_k=9"),
        ({"num_tokens": 1, "top_k": 1, "num_experts": 8, "dtype": "int8"}, "dtype='int8'"),
        ({"num_tokens": 1, "top_k": 2, "num_experts": 8, "apply_router_weight_on_input": True}, "top_k == 1"),
        ({"num_tokens": 1, "top_k": 1, "num_experts": 8, "expert_map": ExpertMap(2, 2)}, "ep_rank=2"),
        ({"num_tokens": 1, "top_k": 1, "num_experts": 8, "shared_experts": -1}, "shared_experts=-1 < 0"),
        (
            {"num_tokens": 1, "top_k": 1, "num_experts": 8, "shared_experts": 1, "apply_router_weight_on_input": True},
            "one expert id per token; shared_experts=1",
        ),
    ],
)
def test_invalid_cases_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MoECase(**kwargs)


@pytest.mark.parametrize("experts", [7, 8, 64, 129])
@pytest.mark.parametrize("ep_size", [2, 4])
def test_expert_map_partitions_every_expert_once(experts, ep_size):
    owned: list[int] = []
    for rank in range(ep_size):
        start, end = ExpertMap(ep_size, rank).local_range(experts)
        owned.extend(range(start, end))
    assert owned == list(range(experts))
    m = ExpertMap(ep_size, 1).as_list(experts)
    local = [v for v in m if v >= 0]
    assert local == list(range(len(local))) and len(local) == ExpertMap(ep_size, 1).local_count(experts)


@given(case=moe_cases())
def test_routing_recipe_gives_valid_distinct_experts_and_normalised_weights(case):
    ids = case.topk_ids()
    weights = case.topk_weights()
    assert len(ids) == case.num_tokens and len(weights) == case.num_tokens
    for row, w in zip(ids, weights):
        assert len(set(row)) == case.top_k, "a token routes to each expert at most once"
        assert all(0 <= e < case.num_experts for e in row)
        if case.apply_router_weight_on_input:  # sigmoid scores, not renormalised (MoECase.topk_weights)
            assert all(0.05 <= x <= 1.05 for x in w)
        else:
            assert abs(sum(w) - 1.0) < 1e-9 and all(x > 0 for x in w)


def test_all_same_routing_shares_every_expert():
    case = MoECase(num_tokens=4, top_k=8, num_experts=128, routing=Routing(RoutingKind.ALL_SAME, seed=3))
    ids = case.topk_ids()
    assert all(sorted(r) == sorted(ids[0]) for r in ids)


def test_placement_labels_round_trip():
    for p in (Placement(False, False), Placement(True, False), Placement(False, True), Placement(True, True)):
        assert Placement.from_label(p.label) == p
    with pytest.raises(ValueError, match="unknown placement"):
        Placement.from_label("gpu")


@given(case=moe_cases(shared=True))
def test_every_token_reaches_every_shared_row_after_its_routed_ids(case):
    """The routed part is the plain case's; the shared ids follow it, the same on every token, at full weight."""
    plain = MoECase.from_dict({k: v for k, v in case.to_dict().items() if k != "shared_experts"})
    shared_ids = list(range(case.num_experts, case.num_experts + case.shared_experts))
    assert case.total_experts == case.local_experts == case.num_experts + case.shared_experts
    assert case.topk_columns == case.top_k + case.shared_experts and case.pairs == case.num_tokens * case.topk_columns
    for row, plain_row, w, plain_w in zip(case.topk_ids(), plain.topk_ids(), case.topk_weights(), plain.topk_weights()):
        assert row == plain_row + shared_ids
        assert w == plain_w + [SHARED_EXPERT_WEIGHT] * case.shared_experts
        assert all(0 <= e < case.total_experts for e in row) and len(set(row)) == len(row)


@pytest.mark.parametrize("experts", [7, 64, 129])
@pytest.mark.parametrize("ep_size", [2, 4])
@pytest.mark.parametrize("shared", [1, 2])
def test_expert_map_keeps_shared_rows_local_after_the_routed_ones(experts, ep_size, shared):
    """vLLM's layout: the routed split unchanged, then every shared id -> this rank's next local rows."""
    for rank in range(ep_size):
        em = ExpertMap(ep_size, rank)
        case = MoECase(num_tokens=1, top_k=1, num_experts=experts, expert_map=em, shared_experts=shared)
        full = case.expert_map_list()
        assert full is not None and len(full) == case.total_experts
        assert full[:experts] == em.as_list(experts)
        routed_local = em.local_count(experts)
        assert full[experts:] == list(range(routed_local, routed_local + shared))
        assert case.local_experts == routed_local + shared == max(full) + 1


def test_static_fp8_scales_round_trip_and_leave_other_quantized_cases_as_they_serialized():
    plain = MoECase(num_tokens=3, top_k=2, num_experts=8, quant=Quant("fp8_w8a8", 0))
    assert '"quant":{"group_size":0,"scheme":"fp8_w8a8"}' in plain.to_json()
    static = MoECase(num_tokens=3, top_k=2, num_experts=8, quant=Quant("fp8_w8a8", 0, static_scales=True))
    assert '"static_scales":true' in static.to_json() and "/static" in static.short()
    for case in (plain, static):
        assert MoECase.from_json(case.to_json()) == case


@pytest.mark.parametrize("quant", [("fp8_w8a8", 128), ("int8_w8a16", 0), ("int4_w4a16", 64)])
def test_static_activation_scales_are_refused_outside_per_tensor_fp8(quant):
    scheme, group = quant
    with pytest.raises(ValueError, match="static activation scales are fp8_w8a8 per-tensor only"):
        Quant(scheme, group, static_scales=True)
