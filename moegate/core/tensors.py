"""Tensors for a case, built without vLLM: layouts, routing, and decision-only inputs.

The layouts here (w13 ``[E_local, 2N, K]``, w2 ``[E_local, K, N]`` with any fused
shared-expert rows after the routed ones, int4 packed two per byte, scale shapes) are shared with the kernel tier's ``moegate.kernels.inputs``,
which draws real values; the dispatch tier only needs ``decision_tensors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from moegate.core.case import MoECase


@dataclass
class CaseTensors:
    """Inputs of one fused-MoE call, laid out as vLLM's Triton experts expect."""

    hidden_states: torch.Tensor  # [M, K]
    w1: torch.Tensor  # [E_local, 2N, K] (K//2 packed for int4; float8_e4m3fn for fp8)
    w2: torch.Tensor  # [E_local, K, N] (N//2 packed for int4)
    topk_weights: torch.Tensor  # [M, top_k + shared] float32
    topk_ids: torch.Tensor  # [M, top_k + shared] int32, global expert ids (shared rows last)
    expert_map: torch.Tensor | None  # [E + shared] int32, global -> local or -1 (shared rows always local)
    w1_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None


def torch_dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def weight_shapes(case: MoECase) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of w13 and w2 as stored (int4 packs two values per byte along the last dim)."""
    e, n, k = case.local_experts, case.intermediate, case.hidden
    pack = 2 if case.quant is not None and case.quant.scheme == "int4_w4a16" else 1
    return (e, 2 * n, k // pack), (e, k, n // pack)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scale_shapes(case: MoECase) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Weight scale shapes: wNa16 per (row, group) or per row; fp8 per expert or per g x g tile."""
    if case.quant is None:
        return None
    e, n, k, g = case.local_experts, case.intermediate, case.hidden, case.quant.group_size
    if not case.quant.weight_only:
        if g > 0:
            return (e, _cdiv(2 * n, g), _cdiv(k, g)), (e, _cdiv(k, g), _cdiv(n, g))
        return (e,), (e,)
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
    if not case.quant.weight_only:
        return torch.float8_e4m3fn
    return torch.int8 if case.quant.scheme == "int8_w8a16" else torch.uint8


def routing_tensors(case: MoECase, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor(case.topk_ids(), dtype=torch.int32, device=device)
    weights = torch.tensor(case.topk_weights(), dtype=torch.float32, device=device)
    return weights, ids


def decision_tensors(case: MoECase, device: torch.device | str = "cpu") -> CaseTensors:
    """Inputs for a decision-only call: right shapes and routing, uninitialised shared weights.

    Such a call stops at the first kernel launch, so no weight value is ever read;
    the weights come from a per-shape cache and cost nothing per case. Calls that
    run to the end draw real values through ``moegate.kernels.inputs.WeightBank``.
    """
    dtype = torch_dtype(case.dtype)
    s1, s2 = weight_shapes(case)
    topk_weights, topk_ids = routing_tensors(case, device)
    emap = case.expert_map_list()
    expert_map = None if emap is None else torch.tensor(emap, dtype=torch.int32, device=device)
    w1, w2 = _empty_weights(s1, s2, _weight_dtype(case), str(device))
    hidden = torch.empty((case.num_tokens, case.hidden), dtype=dtype, device=device)
    scales = scale_shapes(case)
    sc = (torch.empty(scales[0], device=device), torch.empty(scales[1], device=device)) if scales else (None, None)
    return CaseTensors(hidden, w1, w2, topk_weights, topk_ids, expert_map, *sc)
