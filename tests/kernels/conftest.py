"""Kernel-tier fixtures: one weight bank and one warm-up per session, and the session's aggregate check.

Triton compiles vLLM's MoE kernel once per variant (dtype, tile config, naive or
sorted), 0.4-2.3 s each on an H200, so the session warms the common variants
before the properties run and every property draws from the same few shapes.

Every ``run_checked`` call of the session hands its result to one
``moegate.kernels.systematic.Collector``; ``test_systematic_error.py`` runs last and
judges what the session's cases show together (docs/design/kernels-systematic.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from moegate.core.case import ALL_PLACEMENTS, MoECase
from moegate.kernels.check import OBSERVERS
from moegate.kernels.inputs import WeightBank
from moegate.kernels.systematic import Collector
from moegate.strategies.moe import KERNEL_SHAPES

AGGREGATE_TEST = "test_systematic_error.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The aggregate check after every other test of the session, whatever the order of collection."""
    last = [item for item in items if item.path.name == AGGREGATE_TEST]
    items[:] = [item for item in items if item.path.name != AGGREGATE_TEST] + last


@pytest.fixture(scope="session", autouse=True)
def systematic_collector() -> Iterator[Collector]:
    """Every kernel call's sample, from the session's first kernel test to its last."""
    collector = Collector()
    OBSERVERS.append(collector.add)
    try:
        yield collector
    finally:
        OBSERVERS.remove(collector.add)


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
