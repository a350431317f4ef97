"""Tensors for a case, built without vLLM so the torch reference can share them.

Two uses with opposite needs. The dispatch tier on a CPU stops every call at the
first kernel launch, so values are never read: it asks for ``values=False`` and
gets uninitialised weights from a per-shape cache (cheap: thousands of cases a
second). The kernel tier reads every value: weights are drawn from a seeded
generator, scaled so each layer's output is O(1) whatever the hidden size, which
keeps the tolerance rule in ``moegate.reference`` meaningful.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from moegate.case import MoECase


@dataclass
class CaseTensors:
    """Inputs of one fused-MoE call, laid out as vLLM's Triton experts expect."""

    hidden_states: torch.Tensor  # [M, K]
    w1: torch.Tensor  # [E_local, 2N, K] (K//2 packed for int4)
    w2: torch.Tensor  # [E_local, K, N] (N//2 packed for int4)
    topk_weights: torch.Tensor  # [M, top_k] float32
    topk_ids: torch.Tensor  # [M, top_k] int32, global expert ids
    expert_map: torch.Tensor | None  # [E] int32, global -> local or -1
    w1_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None


def torch_dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def weight_shapes(case: MoECase) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of w13 and w2 as stored (int4 packs two values per byte along the last dim)."""
    e, n, k = case.local_experts, case.intermediate, case.hidden
    pack = 2 if case.quant is not None and case.quant.scheme == "int4_w4a16" else 1
    return (e, 2 * n, k // pack), (e, k, n // pack)


def scale_shapes(case: MoECase) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    if case.quant is None:
        return None
    e, n, k, g = case.local_experts, case.intermediate, case.hidden, case.quant.group_size
    if g > 0:
        return (e, 2 * n, k // g), (e, k, n // g)
    return (e, 2 * n, 1), (e, k, 1)


@lru_cache(maxsize=64)
def _empty_weights(
    shape1: tuple[int, ...], shape2: tuple[int, ...], dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(shape1, dtype=dtype, device=device), torch.empty(shape2, dtype=dtype, device=device)


def _weight_dtype(case: MoECase) -> torch.dtype:
    if case.quant is None:
        return torch_dtype(case.dtype)
    return torch.int8 if case.quant.scheme == "int8_w8a16" else torch.uint8


def routing_tensors(case: MoECase, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor(case.topk_ids(), dtype=torch.int32, device=device)
    weights = torch.tensor(case.topk_weights(), dtype=torch.float32, device=device)
    return weights, ids


def make_tensors(
    case: MoECase, device: torch.device | str = "cpu", *, values: bool = True, seed: int = 0
) -> CaseTensors:
    """Inputs for ``case``. With ``values=False`` weights are shared, uninitialised tensors (never read)."""
    dtype = torch_dtype(case.dtype)
    s1, s2 = weight_shapes(case)
    wdtype = _weight_dtype(case)
    topk_weights, topk_ids = routing_tensors(case, device)
    expert_map = None
    if case.expert_map is not None:
        expert_map = torch.tensor(case.expert_map.as_list(case.num_experts), dtype=torch.int32, device=device)
    scales = scale_shapes(case)

    if not values:
        w1, w2 = _empty_weights(s1, s2, wdtype, str(device))
        hidden = torch.empty((case.num_tokens, case.hidden), dtype=dtype, device=device)
        sc = (torch.empty(scales[0], device=device), torch.empty(scales[1], device=device)) if scales else (None, None)
        return CaseTensors(hidden, w1, w2, topk_weights, topk_ids, expert_map, *sc)

    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(shape: tuple[int, ...], scale: float) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, dtype=torch.float32) * scale).to(dtype).to(device)

    hidden = randn((case.num_tokens, case.hidden), 1.0)
    if case.quant is None:
        # N(0, 1/K) entries keep x @ w.T at unit variance, so outputs stay O(1)
        w1 = randn(s1, 1.0 / math.sqrt(case.hidden))
        w2 = randn(s2, 1.0 / math.sqrt(case.intermediate))
        return CaseTensors(hidden, w1, w2, topk_weights, topk_ids, expert_map)
    assert scales is not None
    if case.quant.scheme == "int8_w8a16":
        w1 = torch.randint(-127, 128, s1, generator=gen, dtype=torch.int8).to(device)
        w2 = torch.randint(-127, 128, s2, generator=gen, dtype=torch.int8).to(device)
        q = 127.0
    else:
        w1 = torch.randint(0, 256, s1, generator=gen, dtype=torch.uint8).to(device)
        w2 = torch.randint(0, 256, s2, generator=gen, dtype=torch.uint8).to(device)
        q = 8.0
    w1_scale = randn(scales[0], 1.0).abs().add_(0.5).mul_(1.0 / (q * math.sqrt(case.hidden)))
    w2_scale = randn(scales[1], 1.0).abs().add_(0.5).mul_(1.0 / (q * math.sqrt(case.intermediate)))
    return CaseTensors(hidden, w1, w2, topk_weights, topk_ids, expert_map, w1_scale, w2_scale)
