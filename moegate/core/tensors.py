"""Tensors for a case, built without vLLM: layouts, routing, and decision-only inputs.

The layouts here (w13 ``[E_local, 2N, K]`` for a gated activation, ``[E_local, N, K]`` for
an ungated one, w2 ``[E_local, K, N]`` with any fused shared-expert rows after the routed
ones, int4 packed two per byte, scale shapes, biases ``[E_local, w13 rows]`` and
``[E_local, K]``) are shared with the kernel tier's ``moegate.kernels.inputs``, which draws
real values; the dispatch tier only needs ``decision_tensors``.

A decision-only call never reads a weight or a bias, so ``decision_tensors`` gives
them no memory: each is one row expanded to its shape (stride 0 on the expert and
row axes, 1 on the last, which is all vLLM's entrypoints check before the first
kernel launch). Shapes of real models (512 experts, hidden 7168) then cost nothing,
and neither do token counts at the kernel's 32-bit index boundary, where only the
hidden states and the routing are real tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from moegate.core.case import SHARED_EXPERT_WEIGHT, MoECase


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
    w1_bias: torch.Tensor | None = None  # [E_local, w13 rows] in the compute dtype
    w2_bias: torch.Tensor | None = None  # [E_local, K]
    a1_scale: torch.Tensor | None = None  # fp8 static activation scales (``Quant.static_scales``): 0-D float32
    a2_scale: torch.Tensor | None = None


def torch_dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def weight_shapes(case: MoECase) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of w13 and w2 as stored (int4 packs two values per byte along the last dim)."""
    e, n, k = case.local_experts, case.intermediate, case.hidden
    pack = 2 if case.quant is not None and case.quant.scheme == "int4_w4a16" else 1
    return (e, case.w13_rows, k // pack), (e, k, n // pack)


def bias_shapes(case: MoECase) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Shapes of the w13 and w2 biases, None for a case without them."""
    if not case.bias:
        return None
    return (case.local_experts, case.w13_rows), (case.local_experts, case.hidden)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def scale_shapes(case: MoECase) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Weight scale shapes: wNa16 per (row, group) or per row; fp8 per expert or per g x g tile."""
    if case.quant is None:
        return None
    e, n, k, g = case.local_experts, case.intermediate, case.hidden, case.quant.group_size
    rows = case.w13_rows
    if not case.quant.weight_only:
        if g > 0:
            return (e, _cdiv(rows, g), _cdiv(k, g)), (e, _cdiv(k, g), _cdiv(n, g))
        return (e,), (e,)
    if g > 0:
        return (e, rows, k // g), (e, k, n // g)
    return (e, rows, 1), (e, k, 1)


@lru_cache(maxsize=256)
def placeholder(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """A tensor of ``shape`` backed by one row: its last axis has stride 1, every other stride 0."""
    row = torch.empty((shape[-1],), dtype=dtype, device=device)
    return row.expand(shape)


def _weight_dtype(case: MoECase) -> torch.dtype:
    if case.quant is None:
        return torch_dtype(case.dtype)
    if not case.quant.weight_only:
        return torch.float8_e4m3fn
    return torch.int8 if case.quant.scheme == "int8_w8a16" else torch.uint8


VECTOR_ROUTING_TOKENS = 4096
"""Above this many tokens (the index-width cases) routing is drawn by tensors, not lists (``routing_tensors``)."""


def routing_tensors(case: MoECase, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights, topk_ids) of the case, shared slots last.

    Up to ``VECTOR_ROUTING_TOKENS`` tokens they are the routing recipe's
    (``MoECase.topk_ids``/``topk_weights``). Beyond, Python lists would cost seconds, so
    the recipe's seed draws them as tensors on the CPU, whatever the recipe's kind: each
    token's routed ids are ``top_k`` consecutive experts (modulo the count) from a uniformly
    drawn first one, its weights positive and summing to one (not renormalised with the router
    weight on the input, as ``MoECase.topk_weights``).
    """
    if case.num_tokens <= VECTOR_ROUTING_TOKENS:
        ids = torch.tensor(case.topk_ids(), dtype=torch.int32, device=device)
        weights = torch.tensor(case.topk_weights(), dtype=torch.float32, device=device)
        return weights, ids
    gen = torch.Generator().manual_seed(case.routing.seed)
    m, k, e = case.num_tokens, case.top_k, case.num_experts
    first = torch.randint(0, e, (m, 1), generator=gen)
    routed = (first + torch.arange(k)) % e
    raw = torch.rand((m, k), generator=gen) + 0.05
    w = raw if case.apply_router_weight_on_input else raw / raw.sum(dim=1, keepdim=True)  # as MoECase.topk_weights
    if case.shared_experts:
        shared = torch.arange(e, case.total_experts).expand(m, case.shared_experts)
        routed = torch.cat((routed, shared), dim=1)
        w = torch.cat((w, torch.full((m, case.shared_experts), SHARED_EXPERT_WEIGHT)), dim=1)
    return w.to(device=device, dtype=torch.float32), routed.to(device=device, dtype=torch.int32).contiguous()


def decision_tensors(case: MoECase, device: torch.device | str = "cpu") -> CaseTensors:
    """Inputs for a decision-only call: right shapes and routing, uninitialised shared weights.

    Such a call stops at the first kernel launch, so no weight value is ever read;
    the weights come from a per-shape cache and cost nothing per case. Calls that
    run to the end draw real values through ``moegate.kernels.inputs.WeightBank``.
    """
    dtype = torch_dtype(case.dtype)
    dev = str(device)
    s1, s2 = weight_shapes(case)
    topk_weights, topk_ids = routing_tensors(case, device)
    emap = case.expert_map_list()
    expert_map = None if emap is None else torch.tensor(emap, dtype=torch.int32, device=device)
    wdtype = _weight_dtype(case)
    w1, w2 = placeholder(s1, wdtype, dev), placeholder(s2, wdtype, dev)
    hidden = torch.empty((case.num_tokens, case.hidden), dtype=dtype, device=device)
    scales = scale_shapes(case)
    f32 = torch.float32
    sc = (placeholder(scales[0], f32, dev), placeholder(scales[1], f32, dev)) if scales else (None, None)
    biases = bias_shapes(case)
    bs = (placeholder(biases[0], dtype, dev), placeholder(biases[1], dtype, dev)) if biases else (None, None)
    return CaseTensors(hidden, w1, w2, topk_weights, topk_ids, expert_map, *sc, *bs)
