"""The case model: reproducers round-trip, invalid cases are refused with the reason."""

from __future__ import annotations

import pytest
from hypothesis import given

from moegate.case import ExpertMap, MoECase, Placement, Routing, RoutingKind
from strategies import moe_cases


@given(case=moe_cases())
def test_json_round_trip(case):
    assert MoECase.from_json(case.to_json()) == case


@given(case=moe_cases(expert_map=True, quant=True))
def test_json_round_trip_with_map_and_quant(case):
    assert MoECase.from_json(case.to_json()) == case


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_tokens": 0, "top_k": 1, "num_experts": 8}, "num_tokens=0"),
        ({"num_tokens": 1, "top_k": 9, "num_experts": 8}, "top_k=9"),
        ({"num_tokens": 1, "top_k": 1, "num_experts": 8, "dtype": "int8"}, "dtype='int8'"),
        ({"num_tokens": 1, "top_k": 2, "num_experts": 8, "apply_router_weight_on_input": True}, "top_k == 1"),
        ({"num_tokens": 1, "top_k": 1, "num_experts": 8, "expert_map": ExpertMap(2, 2)}, "ep_rank=2"),
    ],
)
def test_invalid_cases_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MoECase(**kwargs)


@pytest.mark.parametrize("experts", [7, 8, 64, 129])
@pytest.mark.parametrize("ep_size", [2, 4])
def test_expert_map_partitions_every_expert_once(experts, ep_size):
    owned = []
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
