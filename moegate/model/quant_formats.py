"""The weight formats a pre-quantized checkpoint stores, one linear weight at a time: quantize, dequantize, the rounding bound.

Written from the formats, not from vLLM's loader: a linear weight ``W`` is ``[N, K]``
(output rows, input columns), as a checkpoint stores ``gate_proj``/``up_proj``/``down_proj``.

- **fp8 block** (``quant_method: fp8`` with ``weight_block_size: [128, 128]``, the
  DeepSeek-V3 / Qwen3-FP8 layout): float8_e4m3fn values and one float32 ``weight_scale_inv``
  per 128 x 128 tile, ``W ~ q * s``; ``s`` maps the tile's absolute maximum onto 448.
- **int8 channel** (compressed-tensors ``int-quantized``, channel strategy): int8 values in
  [-127, 127] and one float32 ``weight_scale`` per output row (``[N, 1]``).
- **int4 group** (compressed-tensors ``pack-quantized``, symmetric, group strategy): int4
  values in [-8, 7], one ``weight_scale`` per output row and 128 input columns (``[N, K/128]``,
  stored bfloat16 as the model's dtype), packed eight to an int32 along K: value ``8j + i`` of a
  row, plus 8, in bits ``4i..4i+3`` of packed column ``j``.

Each ``*_bound`` returns, per element, how far the dequantized value may lie from the source,
derived in its docstring; the unit tests hold the writer to it.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448
FP8_MANTISSA_BITS = 3
FP8_MIN_NORMAL = float(torch.finfo(FP8).smallest_normal)  # 2**-6
INT8_MAX = 127
INT4_MIN, INT4_MAX = -8, 7
INT4_PER_INT32 = 8
FP32_SLACK = 2.0**-20
"""Relative slack for float32 arithmetic around the rounding (a division, a product: a few 2**-24)."""


def _tiles(w: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``w`` [N, K] (both multiples of the tile) as [N/rows, rows, K/cols, cols]."""
    n, k = w.shape
    return w.reshape(n // rows, rows, k // cols, cols)


def _expand(s: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Per-tile values [N/rows, K/cols] -> one per element [N, K]."""
    return s.repeat_interleave(rows, dim=0).repeat_interleave(cols, dim=1)


def check_divisible(shape: tuple[int, ...], block: tuple[int, int], what: str) -> None:
    """``ValueError`` naming ``what`` unless a 2-D ``shape`` is a whole number of ``block`` tiles."""
    if len(shape) != 2 or shape[0] % block[0] or shape[1] % block[1]:
        raise ValueError(f"{what} has shape {list(shape)}, not a whole number of {block[0]}x{block[1]} blocks")


# --- fp8, block-wise ------------------------------------------------------------------------


def fp8_block_quantize(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn [N, K], float32 scale_inv [N/bn, K/bk]) with ``w ~ q * scale_inv`` tile by tile.

    The scale is the tile's absolute maximum over 448 (an all-zero tile gets scale 1 and zeros);
    ``w / s`` is clamped to +-448 and rounded to nearest by the float8 conversion.
    """
    bn, bk = block
    check_divisible(tuple(w.shape), block, "the weight")
    t = _tiles(w.float(), bn, bk)
    amax = t.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (t / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.reshape(w.shape), scale.float()


def fp8_block_dequantize(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """Float32 weights from fp8 values and their per-tile ``scale_inv``."""
    return q.float() * _expand(scale_inv.float(), *block)


def fp8_block_bound(w: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """Per-element bound on ``|w - dequantize(quantize(w))|``.

    In the scaled domain ``x = w / s`` (``|x| <= 448``, so nothing saturates) rounding to
    e4m3 moves a normal value by at most half a unit in the last place: with 3 mantissa
    bits that is ``2**-4 * |x|``; below the smallest normal (``2**-6``) the spacing is fixed at
    ``2**-9``, so at most ``2**-10``. Back in weight units, times ``s``:
    ``|err| <= max(2**-4 * |w|, 2**-10 * s)``, plus float32 slack on the division and product.
    """
    s = _expand(scale_inv.float(), *block)
    rel = 2.0 ** -(FP8_MANTISSA_BITS + 1)
    sub = FP8_MIN_NORMAL * 2.0**-FP8_MANTISSA_BITS / 2  # half the subnormal spacing
    wf = w.float().abs()
    return torch.maximum(rel * wf, sub * s) + FP32_SLACK * (wf + s)


# --- int8, one scale per output row ------------------------------------------------------------


def int8_channel_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [N, K], float32 scale [N, 1]): symmetric, the row's absolute maximum onto 127."""
    wf = w.float()
    amax = wf.abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.round(wf / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def int8_channel_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()


def int8_channel_bound(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``|err| <= s / 2``: round to nearest integer, and ``|w / s| <= 127`` so nothing clamps."""
    s = scale.float().expand_as(w)
    return 0.5 * s + FP32_SLACK * (w.float().abs() + s)


# --- int4, one scale per output row and group, packed eight to an int32 -----------------------


def int4_group_quantize(
    w: torch.Tensor, group: int = 128, scale_dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values in [-8, 7] of shape [N, K], scale [N, K/group] in ``scale_dtype``).

    Symmetric over the 16 levels: ``s = amax / 7.5`` (so +-amax sit half a step outside the
    range and clamp to 7 / -8), rounded to ``scale_dtype`` first; the values are quantized
    with that stored scale, so dequantization reproduces exactly what was rounded.
    """
    n, k = w.shape
    if k % group:
        raise ValueError(f"the weight has {k} input columns, not a multiple of the group size {group}")
    g = w.float().reshape(n, k // group, group)
    amax = g.abs().amax(dim=2)
    scale = torch.where(amax > 0, amax / ((INT4_MAX - INT4_MIN) / 2), torch.ones_like(amax)).to(scale_dtype)
    q = torch.round(g / scale.float()[:, :, None]).clamp(INT4_MIN, INT4_MAX).to(torch.int8)
    return q.reshape(n, k), scale


def int4_group_dequantize(q: torch.Tensor, scale: torch.Tensor, group: int = 128) -> torch.Tensor:
    return q.float() * scale.float().repeat_interleave(group, dim=1)


def int4_group_bound(w: torch.Tensor, scale: torch.Tensor, group: int = 128) -> torch.Tensor:
    """``|err| <= s * (1/2 + 2**-5)`` with ``s`` the stored scale.

    Unrounded, ``|w / s| <= 7.5``: within range the error is half a step, and +7.5 clamps to 7,
    again half a step. Rounding ``s`` to bfloat16 (8 significant bits: relative ``2**-8``)
    stretches ``|w / s|`` to at most ``7.5 / (1 - 2**-8) < 7.53``, so the clamp costs at most
    ``0.53 s < (1/2 + 2**-5) s``; -7.53 still rounds to -8 or -7, within half a step.
    """
    s = scale.float().repeat_interleave(group, dim=1)
    return (0.5 + 2.0**-5) * s + FP32_SLACK * (w.float().abs() + s)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7], [N, K] -> int32 [N, K/8]: value ``8j + i`` plus 8 in bits ``4i..4i+3`` of column ``j``."""
    n, k = q.shape
    if k % INT4_PER_INT32:
        raise ValueError(f"{k} columns do not pack eight to an int32")
    u = (q.to(torch.int64) - INT4_MIN).reshape(n, k // INT4_PER_INT32, INT4_PER_INT32)
    if u.min() < 0 or u.max() > 15:
        raise ValueError("int4 values must lie in [-8, 7]")
    shifts = torch.arange(INT4_PER_INT32, dtype=torch.int64) * 4
    word = (u << shifts).sum(dim=2)  # in [0, 2**32): the int32 with the same bits
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_int4``: int32 [N, K/8] -> int8 values in [-8, 7], [N, K]."""
    n, j = packed.shape
    shifts = torch.arange(INT4_PER_INT32, dtype=torch.int64) * 4
    u = (packed.to(torch.int64)[:, :, None] >> shifts) & 0xF
    return (u + INT4_MIN).reshape(n, j * INT4_PER_INT32).to(torch.int8)
