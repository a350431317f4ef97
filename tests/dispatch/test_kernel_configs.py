"""The kernel tier's quantized draws against vLLM's own kernel-config heuristics, on a CPU.

vLLM's CUDA wNa16 kernel (int4 weights, group size 32, 64 or 128, at most six
valid tokens per expert) accepts only BLOCK_SIZE_K / group_size in 1, 2, 4, 8,
and the heuristic that picks BLOCK_SIZE_K does not keep to that: the kernel-tier
benchmark crashed vLLM on an H200 with int4, group size 32, at the Qwen3-30B-A3B
shape. ``strategies/kernels.py`` leaves that combination out at the legacy
entrypoint (the one that reaches the CUDA kernel); this asks the installed vLLM's
heuristic, over every legacy int4 case the kernel tier can draw, that
nothing else reaches the crash, and that the combination left out still does (so
the exclusion is dropped once vLLM fixes its heuristic, not kept by habit).
"""

from __future__ import annotations

import pytest

from moegate.kernels.wna16_blocks import rejected
from moegate.strategies.kernels import (
    BIG_SHAPE,
    MAX_KERNEL_TOKENS,
    WNA16_GROUP_SIZES,
    WNA16_OFF_GRID_GROUP,
    WNA16_OFF_GRID_SHAPE,
    group_sizes,
)
from moegate.strategies.moe import KERNEL_SHAPES

TOKENS = range(1, MAX_KERNEL_TOKENS + 1)


@pytest.mark.parametrize("expert_map", [False, True], ids=["no map", "map"])
@pytest.mark.parametrize("shape", KERNEL_SHAPES, ids=lambda s: "E{}-H{}-I{}".format(*s))
def test_no_legacy_int4_draw_gets_a_block_the_cuda_kernel_rejects(target, expert_map, shape):
    """Legacy only: the modular ``TritonWNA16Experts`` always launch the Triton wNa16 kernel, whose blocks are fixed."""
    for group in group_sizes("int4_w4a16", "legacy", expert_map, shape):
        bad = rejected(target, shape, group, TOKENS)
        assert not bad, f"vLLM {target.version}: {bad[:3]}"


def test_the_left_out_combination_is_the_one_vllm_crashes_on(target):
    """What is left out is what crashes; once vLLM stops crashing there, this skips and says to draw it again.

    A skip, not a failure: a vLLM pull request that fixes the heuristic must not
    fail the gate for it.
    """
    left_out = sorted(set(WNA16_GROUP_SIZES) - set(group_sizes("int4_w4a16", "legacy", False, BIG_SHAPE)))
    assert left_out == [32]
    bad = rejected(target, BIG_SHAPE, 32, TOKENS)
    if not bad:
        pytest.skip(
            f"vLLM {target.version} no longer picks a rejected block for int4 group 32 at {BIG_SHAPE}: "
            "strategies/kernels.py can draw it again"
        )
    assert {(r.gemm, r.block_k) for r in bad} == {("w13", 512)}, bad
    assert min((r.tokens, r.top_k) for r in bad) == (1, 3)  # the benchmark's crash, shrunk


def test_int4_with_k_off_the_multiples_of_128_gets_a_block_the_cuda_kernel_takes(target):
    """K 2880: 128 does not divide it; vLLM #30210 shrinks the block to a divisor."""
    assert not rejected(target, WNA16_OFF_GRID_SHAPE, WNA16_OFF_GRID_GROUP, TOKENS)


def test_group_32_at_k_2880_is_left_out_because_vllm_picks_three_groups_a_block(target):
    bad = rejected(target, WNA16_OFF_GRID_SHAPE, 32, TOKENS)
    if not bad:
        pytest.skip(f"vLLM {target.version} takes int4 group 32 at K 2880: strategies/kernels.py can draw it")
    assert {r.block_k for r in bad} == {96}, bad
