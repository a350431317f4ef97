"""The kernel tier's int4 space against vLLM's block heuristic for its CUDA wNa16 kernel.

vLLM's legacy entrypoint sends int4 weights with group size 32, 64 or 128 at small
batches (at most six valid tokens per expert) to a CUDA kernel (the modular
``TritonWNA16Experts`` never do) that accepts only BLOCK_SIZE_K /
group size in 1, 2, 4, 8 and a divisor of K, and picks BLOCK_SIZE_K by a heuristic
that does not keep to the first (the kernel-tier benchmark crashed vLLM on an H200 with group size 32
at the Qwen3-30B-A3B shape), nor, before vLLM #30210, to the second. The dispatch tier asks the installed vLLM's heuristic
over this space (``tests/dispatch/test_kernel_configs.py``); the probe
``lab/gpu/probes/wna16_block_k.py`` reports it and runs the smallest point.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

ACCEPTED_RATIOS = (1, 2, 4, 8)  # BLOCK_SIZE_K // group_size, as vLLM's moe_wna16 kernel checks it
MAX_VALID_TOKENS_PER_EXPERT = 6  # above it vLLM takes its Triton wNa16 kernel, whose blocks are fixed
TOP_KS = range(1, 9)  # the kernel tier's top-k (moegate.strategies.moe.top_ks)


class BlockHeuristic(Protocol):
    """What ``VllmTarget`` answers: vLLM's pick of BLOCK_SIZE_K for one GEMM of a call."""

    def wna16_cuda_block_k(self, *, size_k: int, size_n: int, group_size: int, tokens: int, top_k: int) -> int: ...


@dataclass(frozen=True)
class Rejected:
    """One GEMM of one call whose block the CUDA kernel rejects."""

    shape: tuple[int, int, int]  # (experts, hidden, intermediate)
    gemm: str  # "w13" (the first product) or "w2"
    group: int
    tokens: int
    top_k: int
    block_k: int


def rejected(
    heuristic: BlockHeuristic, shape: tuple[int, int, int], group: int, tokens: Iterable[int]
) -> list[Rejected]:
    """Every (GEMM, token count, top-k) at ``shape`` and ``group`` that reaches vLLM's CUDA kernel with a rejected block."""
    experts, hidden, intermediate = shape
    gemms = {"w13": (hidden, 2 * intermediate), "w2": (intermediate, hidden)}
    out = []
    for (gemm, (size_k, size_n)), t, k in itertools.product(gemms.items(), tokens, TOP_KS):
        if k > experts or t * k > MAX_VALID_TOKENS_PER_EXPERT * experts:
            continue
        block_k = heuristic.wna16_cuda_block_k(size_k=size_k, size_n=size_n, group_size=group, tokens=t, top_k=k)
        if size_k % block_k or block_k % group or block_k // group not in ACCEPTED_RATIOS:
            out.append(Rejected(shape, gemm, group, t, k, block_k))
    return out
