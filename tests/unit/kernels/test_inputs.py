"""The kernel tier's weight bank, on a CPU: what is shared, what is drawn once, what is pinned when.

- a key's numbers depend on the key alone: a second bank (another worker) draws the same bits;
- wNa16 group sizes and activation dtypes of one scheme read one integer storage with their own
  scales; fp8 weights and scales are shared across activation dtypes, not across scale layouts;
- each of w13 and w2 is put on the host the first time a case places it there, once, and marked;
- fp8 quantisation without full-size temporaries gives the bits of the textbook formula;
- fused shared-expert rows are rows of their own, and leave the routed key's numbers alone.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from moegate.core.case import ALL_PLACEMENTS, ExpertMap, MoECase, Placement, Quant
from moegate.dispatch.names import UVA_MARKER
from moegate.kernels.inputs import WeightBank, _fp8_weights

CPU = torch.device("cpu")
DEVICE, W13_HOST, W2_HOST, BOTH_HOST = ALL_PLACEMENTS


def bank() -> WeightBank:
    return WeightBank(CPU, lambda w: w.clone())  # a copy stands in for the pinned UVA view


def case(
    dtype: str = "bfloat16",
    quant: Quant | None = None,
    placement: Placement = DEVICE,
    expert_map: ExpertMap | None = None,
) -> MoECase:
    return MoECase(
        num_tokens=3,
        top_k=2,
        num_experts=16,
        hidden=128,
        intermediate=256,
        dtype=dtype,
        quant=quant,
        placement=placement,
        expert_map=expert_map,
    )


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_a_keys_numbers_depend_on_the_key_alone() -> None:
    for q in (None, Quant("int4_w4a16", 32), Quant("fp8_w8a8", 128)):
        a, b = bank().weights(case(quant=q)), bank().weights(case(quant=q))
        assert same_bits(a.w1, b.w1) and same_bits(a.w2, b.w2)
        if q is not None:
            assert a.w1_scale is not None and b.w1_scale is not None and torch.equal(a.w1_scale, b.w1_scale)


def test_wna16_group_sizes_and_activation_dtypes_share_one_storage_with_their_own_scales() -> None:
    wb = bank()
    g32 = wb.weights(case(quant=Quant("int8_w8a16", 32)))
    g64 = wb.weights(case(quant=Quant("int8_w8a16", 64)))
    fp16 = wb.weights(case("float16", quant=Quant("int8_w8a16", 64)))
    per_channel = wb.weights(case(quant=Quant("int8_w8a16", 0)))
    assert g32.stored is g64.stored is fp16.stored
    assert g32.w1.dtype == torch.uint8 and per_channel.w1.dtype == torch.int8  # zero point or signed
    assert per_channel.stored is not g32.stored
    assert g32.w1_scale is not None and g64.w1_scale is not None and fp16.w1_scale is not None
    assert g32.w1_scale.shape[-1] == 2 * g64.w1_scale.shape[-1]
    assert fp16.w1_scale.dtype == torch.float16 and g64.w1_scale.dtype == torch.bfloat16
    storage = sum(s.stored.w1.numel() + s.stored.w2.numel() for s in (g32, per_channel))  # a byte each
    scales = [t for s in (g32, g64, fp16, per_channel) for t in (s.w1_scale, s.w2_scale) if t is not None]
    assert len(scales) == 8 and wb.device_bytes == storage + sum(2 * t.numel() for t in scales)  # 16-bit scales


def test_fp8_weights_are_shared_across_activation_dtypes_not_across_scale_layouts() -> None:
    wb = bank()
    block_bf16 = wb.weights(case(quant=Quant("fp8_w8a8", 128)))
    block_fp16 = wb.weights(case("float16", quant=Quant("fp8_w8a8", 128)))
    per_tensor = wb.weights(case(quant=Quant("fp8_w8a8", 0)))
    assert block_bf16.stored is block_fp16.stored and block_bf16.w1_scale is block_fp16.w1_scale
    assert per_tensor.stored is not block_bf16.stored
    assert per_tensor.w1_scale is not None and per_tensor.w1_scale.shape == (16,)


def test_each_weight_goes_to_the_host_once_when_a_case_first_places_it_there() -> None:
    wb = bank()
    t, w1, w2 = wb.inputs(case(placement=DEVICE))
    stored = wb.weights(case()).stored
    assert wb.host_bytes == 0 and stored.host == [None, None]
    assert not hasattr(w1, UVA_MARKER) and not hasattr(w2, UVA_MARKER)
    _, w1, w2 = wb.inputs(case(placement=W13_HOST))
    assert stored.host[1] is None and wb.host_bytes == stored.w1.numel() * 2
    assert getattr(w1, UVA_MARKER) is True and not hasattr(w2, UVA_MARKER)
    view = stored.host[0]
    _, w1, w2 = wb.inputs(case(placement=BOTH_HOST, expert_map=ExpertMap(ep_size=2, ep_rank=1)))
    assert stored.host[0] is view  # not copied again
    assert wb.host_bytes == (stored.w1.numel() + stored.w2.numel()) * 2
    assert getattr(w2, UVA_MARKER) is True and w1.shape[0] == w2.shape[0] == 8  # the rank's slice
    assert same_bits(w1, stored.w1[8:]) and same_bits(t.w1, stored.w1)


def textbook_fp8(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each scale maps its tile's absolute maximum onto fp8's largest value, expanded to ``w``'s size."""
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    if group <= 0:
        scale = w.abs().amax(dim=(1, 2)).clamp_min(1e-12) / fp8_max
        full = scale.reshape(-1, 1, 1).expand_as(w)
    else:
        e, rows, cols = w.shape
        scale = torch.empty(e, math.ceil(rows / group), math.ceil(cols / group))
        for i in range(scale.shape[1]):
            for j in range(scale.shape[2]):
                tile = w[:, i * group : (i + 1) * group, j * group : (j + 1) * group]
                scale[:, i, j] = tile.abs().amax(dim=(1, 2)).clamp_min(1e-12) / fp8_max
        full = scale.repeat_interleave(group, 1).repeat_interleave(group, 2)[:, :rows, :cols]
    return (w / full).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn), scale


def test_fp8_quantisation_without_full_size_temporaries_gives_the_textbook_bits() -> None:
    gen = torch.Generator().manual_seed(7)
    for shape in ((3, 256, 128), (2, 200, 130)):  # whole tiles, and partial edge tiles
        w = torch.randn(shape, generator=gen) / 11
        for group in (0, 64, 128):
            q, scale = _fp8_weights(w, group)
            q_ref, scale_ref = textbook_fp8(w, group)
            assert q.is_contiguous() and q.shape == w.shape
            assert same_bits(q, q_ref) and torch.equal(scale, scale_ref), (shape, group)


def test_fused_shared_rows_are_rows_of_their_own_and_leave_the_routed_keys_numbers_alone() -> None:
    plain = case()
    shared = dataclasses.replace(plain, shared_experts=2)
    b = bank()
    t_shared, w1_shared, w2_shared = b.inputs(shared)  # first: the routed key's numbers must not change
    t_plain, _, _ = b.inputs(plain)
    assert w1_shared.shape[0] == w2_shared.shape[0] == t_shared.w1.shape[0] == 18
    assert int(t_shared.topk_ids.max()) == 17 and t_plain.w1.shape[0] == 16
    assert torch.equal(t_plain.w1, bank().inputs(plain)[0].w1)
    with pytest.raises(ValueError, match="fused shared rows"):
        b.inputs(dataclasses.replace(shared, expert_map=ExpertMap(2, 0)))
