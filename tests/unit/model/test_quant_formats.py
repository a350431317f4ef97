"""The checkpoint weight formats: each round trip stays within its derived rounding bound, and the int4 bit layout is the one written down."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moegate.model import quant_formats as qf


@st.composite
def weights(draw: st.DrawFn, rows: int = 128, cols: int = 256) -> torch.Tensor:
    """bf16 weights with a per-row magnitude drawn over many binades, some rows zero, some entries tiny."""
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    scale = 10.0 ** torch.empty(rows, 1).uniform_(-6, 1, generator=gen)
    w = torch.randn(rows, cols, generator=gen) * scale
    if draw(st.booleans()):
        w[: rows // 4] = 0.0  # whole zero tiles / rows / groups
    if draw(st.booleans()):
        w[:, ::7] *= 1e-6  # values far below their tile's maximum (fp8's subnormal range)
    return w.to(torch.bfloat16)


def ratio(w: torch.Tensor, back: torch.Tensor, bound: torch.Tensor) -> float:
    return float(((back - w.float()).abs() / bound).max())


@settings(max_examples=25, deadline=None)
@given(w=weights())
def test_fp8_block_round_trip_stays_within_half_an_e4m3_step(w):
    q, s = qf.fp8_block_quantize(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert s.dtype == torch.float32 and s.shape == (w.shape[0] // 128, w.shape[1] // 128)
    assert ratio(w, qf.fp8_block_dequantize(q, s), qf.fp8_block_bound(w, s)) <= 1.0


@settings(max_examples=25, deadline=None)
@given(w=weights())
def test_int8_channel_round_trip_stays_within_half_a_step(w):
    q, s = qf.int8_channel_quantize(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127 and s.shape == (w.shape[0], 1)
    assert ratio(w, qf.int8_channel_dequantize(q, s), qf.int8_channel_bound(w, s)) <= 1.0


@settings(max_examples=25, deadline=None)
@given(w=weights())
def test_int4_group_round_trip_stays_within_half_a_step_of_the_stored_scale(w):
    q, s = qf.int4_group_quantize(w)
    assert q.dtype == torch.int8 and int(q.min()) >= -8 and int(q.max()) <= 7
    assert s.dtype == torch.bfloat16 and s.shape == (w.shape[0], w.shape[1] // 128)
    assert ratio(w, qf.int4_group_dequantize(q, s), qf.int4_group_bound(w, s)) <= 1.0


@pytest.mark.parametrize("fmt", ["fp8", "int8", "int4"])
def test_each_bound_is_tight_enough_to_catch_a_one_step_error(fmt):
    """On random weights the worst error reaches a good part of its bound, and a value moved by one step exceeds it."""
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    if fmt == "fp8":
        q, s = qf.fp8_block_quantize(w)
        back, bound = qf.fp8_block_dequantize(q, s), qf.fp8_block_bound(w, s)
        step = 2.0**-3 * back.abs()  # one e4m3 step of a normal value
    elif fmt == "int8":
        q8, s = qf.int8_channel_quantize(w)
        back, bound, step = qf.int8_channel_dequantize(q8, s), qf.int8_channel_bound(w, s), s.expand_as(w)
    else:
        q4, s4 = qf.int4_group_quantize(w)
        back, bound = qf.int4_group_dequantize(q4, s4), qf.int4_group_bound(w, s4)
        step = s4.float().repeat_interleave(128, dim=1)
    assert ratio(w, back, bound) > 0.5, "the bound is far looser than the rounding it describes"
    i = int((back - w.float()).abs().argmax())
    moved = back.flatten().clone()
    moved[i] += torch.sign(moved[i] - w.float().flatten()[i]) * step.flatten()[i]
    assert ratio(w, moved.reshape(w.shape), bound) > 1.0


def test_int4_packing_puts_value_8j_plus_i_in_bits_4i_of_column_j():
    q = torch.tensor([list(range(-8, 0)) + list(range(8))], dtype=torch.int8)  # stored as 0..7 then 8..15
    packed = qf.pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (1, 2)
    assert int(packed[0, 0]) == 0x76543210
    assert int(packed[0, 1]) == 0xFEDCBA98 - 2**32  # the same 32 bits, read as a signed int32
    assert torch.equal(qf.unpack_int4(packed), q)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_int4_packing_round_trips(seed):
    q = torch.randint(-8, 8, (4, 64), generator=torch.Generator().manual_seed(seed), dtype=torch.int8)
    assert torch.equal(qf.unpack_int4(qf.pack_int4(q)), q)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: qf.fp8_block_quantize(torch.zeros(128, 200)), "not a whole number of 128x128 blocks"),
        (lambda: qf.fp8_block_quantize(torch.zeros(64, 128)), "not a whole number of 128x128 blocks"),
        (lambda: qf.int4_group_quantize(torch.zeros(8, 100)), "not a multiple of the group size 128"),
        (lambda: qf.pack_int4(torch.zeros(2, 12, dtype=torch.int8)), "do not pack eight to an int32"),
        (lambda: qf.pack_int4(torch.full((1, 8), 9, dtype=torch.int8)), "must lie in [-8, 7]"),
    ],
)
def test_shapes_and_values_a_format_cannot_store_are_refused(call, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call()
