"""A fused-MoE layer with a kernel's roundings, on a CPU: the aggregate check's null and planted errors.

``kernel_output`` computes what vLLM's Triton experts compute, rounding where they
round: the first product's output, the activation's and each expert's weighted
output to the compute dtype, the sum over the top-k experts once at the end; the
products accumulate in float32, in K blocks of ``BLOCK_K`` (a kernel's order, not
the reference's). float32 calls read the products' operands as TF32 (13 low
mantissa bits dropped), as the tensor cores do. ``scale`` multiplies each expert's
output in float32, before it is rounded (as a router weight 1 + eps too large
would): a planted systematic relative error of ``scale - 1``. (Scaling the rounded
output instead is no such error in bfloat16: 1.002 times a bfloat16 value rounds
back to that value unless its mantissa is above 1.95.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moegate.core.case import MoECase
from moegate.core.tensors import CaseTensors, torch_dtype
from moegate.kernels.reference import check_ids, dequantize
from moegate.kernels.systematic import tf32

BLOCK_K = 64


def _blocked(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` in float32, summed over K blocks one after another."""
    k = a.shape[1]
    acc = torch.zeros((a.shape[0], b.shape[0]), dtype=torch.float32)
    for start in range(0, k, BLOCK_K):
        acc = acc + a[:, start : start + BLOCK_K] @ b[:, start : start + BLOCK_K].T
    return acc


def kernel_output(case: MoECase, t: CaseTensors, scale: float = 1.0, operands_tf32: bool = True) -> torch.Tensor:
    """The layer's output in the case's dtype, rounded as the kernel rounds (module docstring).

    ``operands_tf32=False`` gives float32 calls full float32 products (what a
    kernel with IEEE float32 dots computes).
    """
    return kernel_sum(case, t, operands_tf32, scale).to(torch_dtype(case.dtype))


def kernel_sum(case: MoECase, t: CaseTensors, operands_tf32: bool = True, scale: float = 1.0) -> torch.Tensor:
    """``kernel_output`` before its last rounding: the float32 sum of the rounded expert outputs."""
    dtype = torch_dtype(case.dtype)
    fp32 = dtype == torch.float32
    op = tf32 if (fp32 and operands_tf32) else (lambda v: v.float())
    ids = check_ids(t.topk_ids, t.w1.shape[0], t.expert_map)
    weights = t.topk_weights.float()
    m, k = t.hidden_states.shape
    parts = torch.zeros((m, ids.shape[1], k), dtype=dtype)
    x = op(t.hidden_states)
    for e in torch.unique(ids[ids >= 0]).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if case.quant is None:
            w1e, w2e = t.w1[e].float(), t.w2[e].float()
        else:
            assert t.w1_scale is not None and t.w2_scale is not None
            # the kernel dequantizes into the compute dtype
            w1e = dequantize(t.w1[e : e + 1], t.w1_scale[e : e + 1], case.quant)[0].to(dtype).float()
            w2e = dequantize(t.w2[e : e + 1], t.w2_scale[e : e + 1], case.quant)[0].to(dtype).float()
        route = weights[tok, slot].unsqueeze(1)
        h = _blocked(x[tok], op(w1e))
        if case.apply_router_weight_on_input:
            h = h * route
        h = h.to(dtype).float()
        n = h.shape[1] // 2
        act = (F.silu(h[:, :n]) * h[:, n:]).to(dtype).float()
        y = _blocked(op(act), op(w2e))
        if not case.apply_router_weight_on_input:
            y = y * route
        parts[tok, slot] = (y * scale).to(dtype)
    return parts.float().sum(dim=1)
