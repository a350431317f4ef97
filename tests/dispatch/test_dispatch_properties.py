"""The dispatch rule, property by property, at both entrypoints against the installed vLLM.

Each property draws only the cases its clause covers, so a failure names the
clause: a base without the host-residency rule fails the two host properties and
nothing else. Boundary cases (tokens*top_k*4 == experts and one past it) are
pinned with ``@example`` and aimed at with ``hypothesis.target``.

Every property draws cases with and without fused shared-expert rows
(``shared=None``): the clause it covers must hold for both, at both entrypoints,
with the shared rows counted among the experts and their slots among the top-k.
The general property also draws what vLLM's model zoo adds (``golden/census/``):
every activation the Triton experts accept with its clamp limits, expert biases,
and the census's shapes (``wide=True``: K and N not multiples of 128, up to top-16);
none of them may change the decision or what the alignment is handed. The
index-width property runs calls at the kernel's 32-bit boundary
(``moegate.core.index_width``) and checks each reaches the alignment and the kernel
whole.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from moegate.core.case import ALL_PLACEMENTS, ENTRYPOINTS, ExpertMap, MoECase, Placement
from moegate.core.check import assert_path
from moegate.core.index_width import INT32_LIMIT, kernel_extent
from moegate.core.spec import in_naive_region
from moegate.strategies import aim_at_boundary, moe_cases, pin_boundaries
from moegate.strategies.moe import index_width_cases

HOST = st.sampled_from([p for p in ALL_PLACEMENTS if p.host_resident])
DEVICE = Placement(False, False)

entrypoints = pytest.mark.parametrize("entrypoint", ENTRYPOINTS)

SHARED_WITH_MAP = MoECase(num_tokens=1, top_k=1, num_experts=7, shared_experts=1, expert_map=ExpertMap(2, 1))
"""The smallest shared-row case under expert parallelism: rank 1 of 2 holds routed 4-6 and the shared row."""


@entrypoints
@pin_boundaries()
@given(case=moe_cases(expert_map=None, quant=None, shared=None, activation=None, bias=None, wide=True))
def test_path_matches_spec(target, entrypoint, case):
    """Every case: the observed path is the spec's, whatever decides it (activation, biases and shape do not)."""
    aim_at_boundary(case)
    assert_path(target, case, entrypoint)


@entrypoints
@settings(max_examples=6)
@given(case=index_width_cases(expert_map=None))
def test_calls_at_the_kernels_index_width_reach_alignment_and_kernel_whole(target, entrypoint, case):
    """At the 32-bit boundary (both sides): sorted, every id aligned in one call, the kernel handed every token.

    A release that cut such a call into chunks, or counted its ids in a narrower
    integer, would hand the alignment fewer ids or the kernel fewer rows.
    """
    assert abs(kernel_extent(case) - INT32_LIMIT) < case.topk_columns * 2 * max(2 * case.intermediate, case.hidden)
    obs = target.run(case, entrypoint)
    assert assert_path(target, case, entrypoint) == "sorted"
    assert obs.align_id_counts == [case.pairs], obs.align_id_counts
    assert obs.launches[0].rows == case.num_tokens, f"the first launch got {obs.launches[0].rows} rows"


@entrypoints
@pin_boundaries(lambda c: c.placement.host_resident)
@given(case=moe_cases(placement=HOST, shared=None))
def test_host_resident_weights_take_sorted_path(target, entrypoint, case):
    """w13 on the host, w2 on the host, or both: always sorted."""
    aim_at_boundary(case)
    assert assert_path(target, case, entrypoint) == "sorted"


@entrypoints
@pin_boundaries(lambda c: not c.placement.host_resident and in_naive_region(c))
@given(case=moe_cases(placement=DEVICE, region="naive", shared=None))
def test_device_weights_in_naive_region_take_naive_path(target, entrypoint, case):
    """The small-batch optimisation survives for device-resident weights."""
    aim_at_boundary(case)
    assert assert_path(target, case, entrypoint) == "naive"


@entrypoints
@pin_boundaries(lambda c: not in_naive_region(c))
@given(case=moe_cases(region="outside", shared=None))
def test_outside_naive_region_takes_sorted_path(target, entrypoint, case):
    aim_at_boundary(case)
    assert assert_path(target, case, entrypoint) == "sorted"


@entrypoints
@example(case=SHARED_WITH_MAP)
@given(case=moe_cases(expert_map=True, shared=None))
def test_expert_map_takes_sorted_path(target, entrypoint, case):
    """Expert parallelism always aligns, on any placement, shared rows (local on every rank) or not."""
    assert assert_path(target, case, entrypoint) == "sorted"


@entrypoints
@given(case=moe_cases(quant=True, schemes="wna16", group=True, shared=None))
def test_wna16_with_group_size_takes_sorted_path(target, entrypoint, case):
    assert assert_path(target, case, entrypoint) == "sorted"


@entrypoints
@given(case=moe_cases(quant=True, schemes="wna16", group=False, expert_map=None, shared=None))
def test_wna16_per_channel_follows_spec(target, entrypoint, case):
    """Per-channel wNa16: the legacy entrypoint may go naive, the modular wNa16 experts always align."""
    assert_path(target, case, entrypoint)


@entrypoints
@given(case=moe_cases(quant=True, schemes="fp8", expert_map=None, shared=None))
def test_fp8_follows_the_unquantized_rule(target, entrypoint, case):
    """fp8 weights (per-tensor or 128 x 128 blocks): naive in the region on device, sorted on the host.

    Block-wise fp8 passes ``block_shape[1] = 128 > 0``; only wNa16 may let that force the alignment.
    """
    aim_at_boundary(case)
    assert_path(target, case, entrypoint)
