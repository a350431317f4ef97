"""The strategies reach what the dispatch tier needs, on purpose rather than by luck, and the kernel tier's
cases are ones vLLM's GPU kernels run, built so rather than filtered."""

from __future__ import annotations

from typing import TypedDict

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import FailedHealthCheck

from moegate.core.case import ALL_PLACEMENTS, ENTRYPOINTS, MoECase, Placement
from moegate.core.spec import SPARSITY_FACTOR, in_naive_region
from moegate.strategies import BOUNDARY_EXAMPLES, KERNEL_SHAPES, moe_cases
from moegate.strategies.kernels import BIG_SHAPE, census_kernel_cases, kernel_cases

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


# --- the kernel tier's cases -------------------------------------------------------

HOST = st.sampled_from([p for p in ALL_PLACEMENTS if p.host_resident])


class KernelDraw(TypedDict, total=False):
    """The keyword arguments of ``kernel_cases`` a draw below passes (checked against its signature)."""

    placement: Placement | st.SearchStrategy[Placement] | None
    region: str | None
    expert_map: bool | None
    quant: bool | None
    schemes: str | None


KERNEL_DRAWS: dict[str, KernelDraw] = {
    # every way tests/kernels and moegate/kernels/sweep.py call kernel_cases
    "any": {"expert_map": None, "quant": None},
    "host": {"placement": HOST, "expert_map": False},
    "naive region": {"placement": Placement(), "region": "naive", "expert_map": False},
    "outside": {"placement": Placement(), "region": "outside", "expert_map": None},
    "expert map": {"expert_map": True},
    "fp8": {"placement": Placement(), "quant": True, "schemes": "fp8", "expert_map": False},
    "wna16 only": {"expert_map": None, "quant": None, "schemes": "wna16"},
    "quantized, any map": {"expert_map": None, "quant": True},
}
ALL_CHECKS_ON = settings(max_examples=100, deadline=None, database=None, suppress_health_check=())
"""Every health check on, too_slow included (the ci profile silences it for stalling CI machines)."""


def unsupported(case: MoECase, entrypoint: str) -> list[str]:
    """What vLLM's GPU kernels do not run, restated from ``strategies/kernels.py``'s docstring."""
    problems = []
    shape = (case.num_experts, case.hidden, case.intermediate)
    if shape not in KERNEL_SHAPES:
        problems.append(f"shape {shape} not in KERNEL_SHAPES")
    if shape == (128, 2048, 768) and case.dtype != "bfloat16":
        problems.append(f"Qwen3-30B-A3B shape in {case.dtype}")
    q = case.quant
    if q is not None and case.dtype not in ("bfloat16", "float16"):
        problems.append(f"{q.scheme} with {case.dtype} activations")
    if q is not None and q.weight_only and 0 < q.group_size < 32:
        problems.append(f"wNa16 group size {q.group_size}")
    if q is not None and q.weight_only and q.group_size <= 0 and (q.scheme == "int4_w4a16" or entrypoint == "modular"):
        problems.append(f"per-channel {q.scheme} at {entrypoint}")
    int4_g32 = q is not None and q.scheme == "int4_w4a16" and q.group_size == 32
    if int4_g32 and shape == (128, 2048, 768) and entrypoint == "legacy":
        problems.append("legacy int4 group size 32 at the Qwen3-30B-A3B shape")
    if q is not None and not q.weight_only and q.group_size <= 0 and case.expert_map and entrypoint == "legacy":
        problems.append("fp8 per-tensor with an expert map at legacy")
    return problems


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
@pytest.mark.parametrize("draw", list(KERNEL_DRAWS))
@ALL_CHECKS_ON
@given(data=st.data())
def test_kernel_cases_are_supported_by_construction(entrypoint, draw, data):
    """Every drawn case is one vLLM's GPU kernels run, with no filter for a health check to complain about."""
    case = data.draw(kernel_cases(entrypoint, **KERNEL_DRAWS[draw]), label="case")
    assert not unsupported(case, entrypoint), f"{unsupported(case, entrypoint)}: {case.to_json()}"


@pytest.mark.parametrize(
    ("entrypoint", "kwargs", "reached"),
    [
        ("legacy", {"quant": True, "schemes": "wna16"}, lambda c: c.quant.group_size <= 0),
        ("legacy", {"quant": True, "schemes": "wna16"}, lambda c: c.quant.scheme == "int4_w4a16"),
        ("modular", {"quant": True, "schemes": "fp8", "expert_map": True}, lambda c: c.quant.group_size <= 0),
        ("legacy", {"quant": True, "schemes": "fp8", "expert_map": True}, lambda c: c.quant.group_size == 128),
        ("legacy", {}, lambda c: (c.num_experts, c.hidden, c.intermediate) == BIG_SHAPE),
        ("modular", {"quant": True, "schemes": "wna16"},
         lambda c: c.quant.scheme == "int4_w4a16" and c.quant.group_size == 32
         and (c.num_experts, c.hidden, c.intermediate) == BIG_SHAPE),
        ("modular", {}, lambda c: c.dtype == "float32"),
        ("modular", {"quant": True, "schemes": "fp8"}, lambda c: c.quant.group_size == 64),
        ("legacy", {"quant": True, "schemes": "fp8", "expert_map": True}, lambda c: c.quant.group_size == 32),
    ],
    ids=["legacy int8 per-channel", "int4 grouped", "modular fp8 per-tensor, map", "legacy fp8 blocks, map",
         "Qwen3-30B-A3B shape", "modular int4 group 32 at the Qwen3-30B-A3B shape", "float32",
         "modular fp8 64 x 64 blocks", "legacy fp8 32 x 32 blocks, map"],
)  # fmt: skip
def test_kernel_cases_still_reach_what_the_kernels_support(entrypoint, kwargs, reached):
    """Building the constraints in removed only the unsupported cases."""
    assert reached(find(kernel_cases(entrypoint, **kwargs), reached, settings=FIND))


def test_a_filtering_strategy_fails_these_settings():
    """The settings above do raise a health check: a strategy that filters most draws away fails them."""

    rare = moe_cases(kernel_shapes=True).filter(lambda c: c.dtype == "float16" and c.num_experts == 16 and c.top_k == 3)

    @settings(ALL_CHECKS_ON, derandomize=True)
    @given(case=rare)
    def filtered(case):
        pass

    with pytest.raises(FailedHealthCheck, match="filter"):
        filtered()


def test_unknown_kernel_arguments_fail_at_once():
    with pytest.raises(ValueError, match="unknown entrypoint"):
        kernel_cases("marlin")
    with pytest.raises(ValueError, match="unknown scheme family"):
        kernel_cases("legacy", quant=True, schemes="int2")


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


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
def test_census_kernel_cases_reach_an_intermediate_size_16_does_not_divide(entrypoint):
    """Nemotron-H's N = 7688: Triton compiles the kernel without its divisibility-by-16 attribute (the reach report)."""
    case = find(census_kernel_cases(entrypoint), lambda c: c.intermediate % 16 != 0, settings=FIND)
    assert (case.num_experts, case.hidden, case.intermediate, case.top_k) == (8, 4096, 7688, 2)
