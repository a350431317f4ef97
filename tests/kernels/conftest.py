"""Kernel-tier fixtures: one weight bank and one warm-up per session.

Triton compiles vLLM's MoE kernel once per variant (dtype, tile config, naive or
sorted), 0.4-2.3 s each on an H200, so the session warms the common variants
before the properties run and every property draws from the same few shapes.
"""

from __future__ import annotations

import time

import pytest

from moegate.core.case import ALL_PLACEMENTS, MoECase
from moegate.kernels.inputs import WeightBank
from moegate.testing.strategies.moe import KERNEL_SHAPES


@pytest.fixture(scope="session")
def bank(cuda_target) -> WeightBank:
    return WeightBank(cuda_target.device, cuda_target.host_view)


@pytest.fixture(scope="session")
def warm(cuda_target, bank: WeightBank, record_testsuite_property) -> float:
    """Compile the bfloat16 naive and sorted variants of every kernel shape once; returns seconds."""
    import torch

    start = time.perf_counter()
    for experts, hidden, inter in KERNEL_SHAPES:
        for tokens in (1, 2, 4, 8):
            for placement in (ALL_PLACEMENTS[0], ALL_PLACEMENTS[3]):
                case = MoECase(
                    num_tokens=tokens,
                    top_k=min(8, experts),
                    num_experts=experts,
                    hidden=hidden,
                    intermediate=inter,
                    placement=placement,
                )
                t, w1, w2 = bank.inputs(case)
                for ep in ("legacy", "modular"):
                    cuda_target.run_placed(case, ep, t, w1, w2)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    record_testsuite_property("warmup_seconds", f"{elapsed:.1f}")
    return elapsed
