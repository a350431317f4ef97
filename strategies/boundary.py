"""The naive/sorted threshold ``tokens * top_k * 4 == experts`` reached on purpose: ``hypothesis.target``
(``aim_at_boundary``) in the tests, and pinned ``@example`` cases (``BOUNDARY_EXAMPLES`` / ``pin_boundaries``).

Shared rows count as the entrypoints see them: ``top_k + shared`` ids per token over ``experts + shared`` rows
(``MoECase.pairs``, ``MoECase.total_experts``); ``moegate.strategies.moe`` draws cases on or next to the threshold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import example, target

from moegate.core.case import ALL_PLACEMENTS, MoECase
from moegate.core.spec import SPARSITY_FACTOR

T = TypeVar("T", bound=Callable[..., Any])


def aim_at_boundary(case: MoECase) -> None:
    """Steer generation towards ``tokens * top_k * 4 == experts``, shared rows counted (call inside a test)."""
    target(-abs(case.pairs * SPARSITY_FACTOR - case.total_experts), label="distance to naive threshold")


def _boundary_examples() -> tuple[MoECase, ...]:
    cases = []
    # (tokens, top_k, experts): on the threshold, one past it, and the real models' decode sizes
    grid = [
        (2, 8, 64),  # 64 == 64: last naive case (docs/spec.md's threshold example)
        (2, 8, 63),  # 64 > 63: first sorted
        (4, 8, 128),  # Qwen3-30B-A3B at 4 requests in flight: naive for device weights
        (5, 8, 128),  # one more token: sorted
        (1, 1, 4),  # smallest naive case
        (1, 1, 3),
        (8, 8, 256),  # 256 experts, top-8
    ]
    for tokens, k, experts in grid:
        for p in ALL_PLACEMENTS:
            cases.append(MoECase(num_tokens=tokens, top_k=k, num_experts=experts, placement=p))
    # fused shared rows, (tokens, top_k, routed experts, shared): the same threshold over top_k + shared ids
    # per token and experts + shared rows
    shared_grid = [
        (1, 1, 7, 1),  # 1*(1+1)*4 == 7+1: on the threshold; naive only because the shared row is counted
        (1, 1, 6, 1),  # 8 > 6+1: sorted; leaving the shared slot out of top_k would say naive
        (7, 8, 256, 1),  # DeepSeek-V3 (256 routed, 1 shared, top-8) at 7 tokens: 7*9*4=252 <= 257, naive
        (8, 8, 256, 1),  # at 8 tokens: 288 > 257, sorted, where the same model without the fused row is naive
        (2, 6, 64, 2),  # DeepSeek-V2-Lite (64 routed, 2 shared, top-6): 2*8*4=64 <= 66, naive
        (3, 6, 64, 2),  # 96 > 66: sorted
    ]
    for tokens, k, experts, shared in shared_grid:
        for p in ALL_PLACEMENTS:
            cases.append(MoECase(num_tokens=tokens, top_k=k, num_experts=experts, placement=p, shared_experts=shared))
    return tuple(cases)


BOUNDARY_EXAMPLES: tuple[MoECase, ...] = _boundary_examples()


def pin_boundaries(predicate: Callable[[MoECase], bool] = lambda c: True, **kwargs: Any) -> Callable[[T], T]:
    """Decorator: ``@example(case=...)`` for each pinned boundary case the test covers."""

    def deco(fn: T) -> T:
        for case in BOUNDARY_EXAMPLES:
            if predicate(case):
                fn = example(case=case, **kwargs)(fn)
        return fn

    return deco
