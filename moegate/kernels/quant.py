"""The quantized formats as the torch reference reads them: int4 packed two per byte, group and block scales, the implicit zero points of wNa16, fp8 (e4m3) with dynamic scales.

The rules come from the formats (and are checked against vLLM's kernels by the kernel tier), not from vLLM's code."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moegate.core.case import Quant

ZERO_POINT = {"int4_w4a16": 8, "int8_w8a16": 128}
"""Implicit zero point of grouped wNa16 weights stored unsigned (no explicit zero points)."""


FP8_MAX = 448.0
"""Largest finite float8_e4m3fn value: dynamic scales map each absolute maximum onto it."""


FP8_EPS = 1e-10
"""Floor of a block-wise absolute maximum, so an all-zero group gets a finite scale."""


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Two 4-bit values per byte along the last dim, the even index in the low nibble."""
    p = packed.to(torch.int32)
    low, high = p & 0xF, (p >> 4) & 0xF
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _expand_tiles(scale: torch.Tensor, g: int, rows: int, cols: int) -> torch.Tensor:
    """[E, ceil(R/g), ceil(C/g)] tile scales -> [E, R, C], one value per element."""
    return scale.float().repeat_interleave(g, dim=1).repeat_interleave(g, dim=2)[:, :rows, :cols]


def dequantize(w: torch.Tensor, scale: torch.Tensor, quant: Quant, *, zero_point: bool = True) -> torch.Tensor:
    """Float32 weights from quantized storage.

    wNa16 per-channel (group size 0, int8 only): signed int8 times one scale per
    output row. wNa16 grouped: (unsigned stored value - implicit zero point) times
    one scale per (output row, group of ``group_size`` input columns).
    fp8 per-tensor: float8_e4m3fn times one scale per expert; fp8 block-wise:
    times one scale per ``group_size`` x ``group_size`` tile. ``zero_point=False`` leaves the
    implicit zero point out (the reach report's question: does a case make it matter?).
    """
    if quant.scheme == "fp8_w8a8":
        q = w.float()
        if quant.group_size > 0:
            return q * _expand_tiles(scale, quant.group_size, q.shape[1], q.shape[2])
        return q * scale.float().reshape(-1, 1, 1)
    if quant.scheme == "int4_w4a16":
        q = unpack_int4(w)
    elif quant.scheme == "int8_w8a16":
        q = w.to(torch.int32)
    else:
        raise ValueError(f"unknown quantization scheme {quant.scheme!r}")
    if quant.group_size <= 0:
        if quant.scheme != "int8_w8a16":
            raise ValueError("per-channel (group size 0) storage is defined for int8_w8a16 only")
        return q.float() * scale.float().reshape(*scale.shape[:2], 1)
    q = q - ZERO_POINT[quant.scheme] if zero_point else q
    s = scale.float().repeat_interleave(quant.group_size, dim=-1)
    return q.float() * s


def fp8_quantize(x: torch.Tensor, quant: Quant, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 quantization of ``x`` [rows, cols]: (float8_e4m3fn values, float32 scales).

    Dynamic (``scale`` None): per-tensor (group size <= 0) one scale, shape [1]; block-wise
    one scale per row and ``group_size`` columns, shape [rows, ceil(cols / group_size)]. The
    scale maps the absolute maximum to ``FP8_MAX``; values are multiplied by its
    reciprocal, clamped and rounded to nearest. Static (``scale`` given, per-tensor only):
    values are divided by that scale, clamped to the fp8 range (a value past ``FP8_MAX``
    times the scale saturates) and rounded to nearest; the scale comes back as shape [1].
    """
    x = x.float()
    if scale is not None:
        if quant.group_size > 0:
            raise ValueError("static activation scales are per-tensor only")
        s = scale.float().reshape(1)
        return (x / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), s
    if quant.group_size > 0:
        g = quant.group_size
        rows, cols = x.shape
        pad = (-cols) % g
        xp = F.pad(x, (0, pad)).reshape(rows, -1, g)
        scale = xp.abs().amax(dim=-1, keepdim=True).clamp_min(FP8_EPS) / FP8_MAX
        q = (xp * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        return q.reshape(rows, -1)[:, :cols], scale.reshape(rows, -1)
    amax = x.abs().max().clamp_min(FP8_EPS)
    scale = (amax / FP8_MAX).reshape(1)
    q = (x * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def quantize_activation(x: torch.Tensor, quant: Quant, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` [rows, cols] after fp8 quantization (``fp8_quantize``: dynamic, or static with ``scale``) and back, in float32."""
    q, scale = fp8_quantize(x, quant, scale)
    return dequantize_activation(q, scale, quant.group_size)[0]


def dequantize_activation(q: torch.Tensor, scale: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A quantized activation [rows, cols] and its scales, as float32 values and per-element scales."""
    rows, cols = q.shape
    if scale.numel() == 1:
        full = scale.float().reshape(1, 1).expand(rows, cols)
    else:
        full = scale.float().reshape(rows, -1).repeat_interleave(group, dim=1)[:, :cols]
    return q.float() * full, full
