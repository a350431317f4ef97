"""The strategies reach what the dispatch tier needs, on purpose rather than by luck."""

from __future__ import annotations

import pytest
from hypothesis import find, given, settings

from moegate.case import ALL_PLACEMENTS
from moegate.spec import SPARSITY_FACTOR, in_naive_region
from strategies import BOUNDARY_EXAMPLES, moe_cases

pytestmark = pytest.mark.unit

FIND = settings(max_examples=500, database=None, deadline=None, derandomize=True)  # a find that passed once always does


@pytest.mark.parametrize("placement", ALL_PLACEMENTS, ids=lambda p: p.label)
def test_every_placement_is_drawn(placement):
    assert find(moe_cases(), lambda c: c.placement == placement, settings=FIND).placement == placement


def test_exact_boundary_is_drawn():
    c = find(moe_cases(), lambda c: c.pairs * SPARSITY_FACTOR == c.num_experts and c.num_tokens > 1, settings=FIND)
    assert c.pairs * SPARSITY_FACTOR == c.num_experts


def test_one_past_boundary_is_drawn():
    find(
        moe_cases(),
        lambda c: c.pairs * SPARSITY_FACTOR == c.num_experts + c.top_k * SPARSITY_FACTOR and c.num_experts >= 64,
        settings=FIND,
    )


@pytest.mark.parametrize("experts", [128, 256])
def test_model_expert_counts_are_drawn(experts):
    find(moe_cases(), lambda c: c.num_experts == experts, settings=FIND)


@given(case=moe_cases(region="naive"))
def test_naive_region_strategy_stays_inside(case):
    assert in_naive_region(case)


@given(case=moe_cases(region="outside"))
def test_outside_region_strategy_stays_outside(case):
    assert not in_naive_region(case)


@given(case=moe_cases(quant=True))
def test_wna16_cases_use_16_bit_activations(case):
    assert case.dtype in ("bfloat16", "float16")


@given(case=moe_cases(kernel_shapes=True, region="naive"))
def test_kernel_shapes_stay_in_the_fixed_set(case):
    from strategies import KERNEL_SHAPES

    assert (case.num_experts, case.hidden, case.intermediate) in KERNEL_SHAPES
    assert in_naive_region(case)


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "shared rows"])
def test_pinned_examples_straddle_the_threshold(shared):
    pinned = [c for c in BOUNDARY_EXAMPLES if (c.shared_experts > 0) == shared]
    on = [c for c in pinned if c.pairs * SPARSITY_FACTOR == c.total_experts]
    past = [c for c in pinned if c.pairs * SPARSITY_FACTOR > c.total_experts]
    assert on and past
    assert {c.placement for c in on} == set(ALL_PLACEMENTS)
    assert {c.placement for c in past} == set(ALL_PLACEMENTS)


@pytest.mark.parametrize("shared", [0, 1, 2])
def test_shared_row_counts_are_drawn(shared):
    find(moe_cases(shared=None), lambda c: c.shared_experts == shared, settings=FIND)


def test_shared_rows_are_drawn_with_an_expert_map():
    find(moe_cases(shared=True, expert_map=True), lambda c: c.expert_map is not None, settings=FIND)


def test_exact_boundary_with_shared_rows_is_drawn():
    find(
        moe_cases(shared=True),
        lambda c: c.pairs * SPARSITY_FACTOR == c.total_experts and c.num_tokens > 1,
        settings=FIND,
    )


@given(case=moe_cases(region="naive", shared=True))
def test_naive_region_strategy_with_shared_rows_stays_inside(case):
    assert in_naive_region(case) and case.shared_experts > 0


@given(case=moe_cases(region="outside", shared=True))
def test_outside_region_strategy_with_shared_rows_stays_outside(case):
    assert not in_naive_region(case) and case.shared_experts > 0


@given(case=moe_cases())
def test_shared_rows_only_when_asked(case):
    assert case.shared_experts == 0
