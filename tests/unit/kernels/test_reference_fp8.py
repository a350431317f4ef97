"""The fp8_w8a8 reference: its quantizers from their definition, and the MoE against a dense formulation.

fp8 quantizes activations inside the call, so the reference emulates that
(``quantize_activation``) and the kernel-tier inputs store fp8 weights with
scales (``kernel_inputs._fp8_weights``). Both are checked here on a CPU, where
torch rounds float32 to float8_e4m3fn the same way a GPU does.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from moegate.core.case import Quant
from moegate.kernels.inputs import _fp8_weights
from moegate.kernels.quant import FP8_MAX, dequantize, quantize_activation
from moegate.kernels.reference import reference_moe
from moegate.kernels.tolerance import compare

PER_TENSOR, BLOCK = Quant("fp8_w8a8", 0), Quant("fp8_w8a8", 4)
FP8_STEP = 2.0**-3  # float8_e4m3fn: 3 explicit mantissa bits


def test_per_tensor_scale_maps_the_maximum_onto_the_fp8_range():
    x = torch.tensor([[0.5, -2.0], [1.0, 0.25]])
    q = quantize_activation(x, PER_TENSOR)
    # scale 2/448: every value here is a power of two times the scale, so exactly representable
    assert q.tolist() == x.tolist()


def test_block_scales_are_per_row_and_group():
    x = torch.tensor([[1.0, 100.0, 3.0, 3.0, 0.0, 0.0]])
    q = quantize_activation(x, Quant("fp8_w8a8", 2))
    # group [1, 100]: scale 100/448, 1 lands between fp8 steps; group [3, 3] is exact; the zero group stays zero
    assert q[0, 2:].tolist() == [3.0, 3.0, 0.0, 0.0]
    assert q[0, 1].item() == pytest.approx(100.0)
    assert abs(q[0, 0].item() - 1.0) <= FP8_STEP


@given(seed=st.integers(0, 2**31 - 1), quant=st.sampled_from([PER_TENSOR, BLOCK]), cols=st.sampled_from([4, 6, 8]))
def test_activation_quantization_is_within_one_fp8_step_and_idempotent(seed, quant, cols):
    x = torch.randn(3, cols, generator=torch.Generator().manual_seed(seed))
    q = quantize_activation(x, quant)
    # relative to its scale's maximum: half an fp8 step near the top, finer below
    assert ((q - x).abs() <= FP8_STEP * x.abs().max() / 2 + 1e-7).all()
    assert torch.equal(quantize_activation(q, quant), q)


def test_fp8_dequantize_per_tensor_and_per_tile():
    w = torch.tensor([[[1.0, 2.0, 4.0], [0.5, 1.0, 1.0]]]).to(torch.float8_e4m3fn)  # [E=1, 2, 3]
    assert dequantize(w, torch.tensor([3.0]), PER_TENSOR).tolist() == [[[3.0, 6.0, 12.0], [1.5, 3.0, 3.0]]]
    tiles = torch.tensor([[[1.0, 10.0]]])  # tiles of 2 x 2: columns 0-1 and the partial column 2
    assert dequantize(w, tiles, Quant("fp8_w8a8", 2)).tolist() == [[[1.0, 2.0, 40.0], [0.5, 1.0, 10.0]]]


@pytest.mark.parametrize("group", [0, 4, 3])
def test_stored_fp8_weights_round_trip_within_one_step(group):
    w = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(group))
    q, scale = _fp8_weights(w, group)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    back = dequantize(q, scale, Quant("fp8_w8a8", group))
    assert ((back - w).abs() <= FP8_STEP * w.abs().amax(dim=(1, 2), keepdim=True) / 2 + 1e-7).all()
    assert (q.float().abs().amax(dim=(1, 2)) == FP8_MAX).all()  # each expert uses the whole range


def dense_activation_bound(x_row, w1_rows, cdtype):
    """|act| of one token through each of its experts (unquantized input): the scale of one fp8 step."""
    n = w1_rows.shape[1] // 2
    h = torch.einsum("k,enk->en", x_row, w1_rows)
    return (F.silu(h[:, :n]) * h[:, n:]).to(cdtype).float().abs() * 1.25 + 1e-6


def dense_fp8(x, w1, w2, topk_weights, topk_ids, quant, cdtype):
    """Every token through every expert with one-hot masks; same quantization steps, no per-expert loop."""
    e = w1.shape[0]
    onehot = F.one_hot(topk_ids.long(), e).float()  # [M, k, E]
    n = w2.shape[2]
    h = torch.einsum("mk,enk->men", quantize_activation(x, quant), w1).to(cdtype).float()
    act = (F.silu(h[..., :n]) * h[..., n:]).to(cdtype).float()  # [M, E, N]
    routed = torch.einsum("mke,men->mkn", onehot, act)  # the activation of each (token, slot)
    m, k = topk_ids.shape
    aq = quantize_activation(routed.reshape(m * k, n), quant).reshape(m, k, n)
    y = torch.einsum("mkn,mke,ehn->mkh", aq, onehot, w2)
    return torch.einsum("mkh,mk->mh", y, topk_weights)


@given(
    seed=st.integers(0, 2**31 - 1),
    quant=st.sampled_from([PER_TENSOR, BLOCK]),
    cdtype=st.sampled_from([torch.bfloat16, torch.float16]),
)
def test_fp8_reference_equals_a_dense_formulation(seed, quant, cdtype):
    g = torch.Generator().manual_seed(seed)
    e, m, k, hid, inter = 6, 5, 2, 8, 4
    x = torch.randn(m, hid, generator=g).to(cdtype)
    w1, s1 = _fp8_weights(torch.randn(e, 2 * inter, hid, generator=g) / math.sqrt(hid), quant.group_size)
    w2, s2 = _fp8_weights(torch.randn(e, hid, inter, generator=g) / math.sqrt(inter), quant.group_size)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]).to(torch.int32)
    w = torch.rand(m, k, generator=g) + 0.05
    w = w / w.sum(-1, keepdim=True)
    ref = reference_moe(x, w1, w2, w, ids, quant=quant, w1_scale=s1, w2_scale=s2)
    w2d = dequantize(w2, s2, quant)
    dense = dense_fp8(x.float(), dequantize(w1, s1, quant), w2d, w, ids, quant, cdtype)
    off = ~torch.isclose(ref.output, dense, rtol=1e-4, atol=1e-5)
    # The two formulations sum the first product in different orders, so an intermediate can land on
    # the other side of an fp8 rounding step in the second quantization (seed 317, fp16, blocks of 4:
    # 9.5e-5 off): that moves one token's row by at most one fp8 step of its activations through w2.
    # Allowed for one row at most, within that bound; a routing or weighting fault moves every row.
    rows = off.any(dim=1)
    assert int(rows.sum()) <= 1, f"{int(rows.sum())} of {len(rows)} rows differ: {(ref.output - dense).abs().max()}"
    if rows.any():
        m_ = int(rows.nonzero()[0])
        e_ids = ids[m_].long()
        step = FP8_STEP * dense_activation_bound(x.float()[m_], dequantize(w1, s1, quant)[e_ids], cdtype)  # [k, n]
        bound = torch.einsum("k,kn,khn->h", w[m_], step, w2d[e_ids].abs())
        assert ((ref.output[m_] - dense[m_]).abs() <= bound + 1e-5).all(), (ref.output[m_] - dense[m_]).abs().max()


def test_fp8_reference_is_not_the_unquantized_one_and_tolerance_rejects_a_dropped_expert():
    """Quantizing activations changes the output measurably; the fp8 bound still fails a dropped expert."""
    g = torch.Generator().manual_seed(3)
    e, m, k, hid, inter = 16, 4, 8, 256, 128
    x = torch.randn(m, hid, generator=g).bfloat16()
    w1, s1 = _fp8_weights(torch.randn(e, 2 * inter, hid, generator=g) / math.sqrt(hid), 0)
    w2, s2 = _fp8_weights(torch.randn(e, hid, inter, generator=g) / math.sqrt(inter), 0)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]).to(torch.int32)
    w = torch.full((m, k), 1.0 / k)
    ref = reference_moe(x, w1, w2, w, ids, quant=PER_TENSOR, w1_scale=s1, w2_scale=s2)
    plain = reference_moe(x, dequantize(w1, s1, PER_TENSOR), dequantize(w2, s2, PER_TENSOR), w, ids)
    assert not torch.equal(ref.output, plain.output)
    assert compare(ref.output.bfloat16(), ref, torch.bfloat16, PER_TENSOR).ok
    w_drop = w.clone()
    w_drop[0, 0] = 0
    dropped = reference_moe(x, w1, w2, w_drop, ids, quant=PER_TENSOR, w1_scale=s1, w2_scale=s2).output
    assert not compare(dropped.bfloat16(), ref, torch.bfloat16, PER_TENSOR).ok


# --- the staged check the kernel tier runs on fp8 calls --------------------------------


def fake_fp8_kernel(x, w1, s1, w2, s2, w, ids, quant, *, wrong_expert=False, drop_output_expert=False):
    """A CPU stand-in for vLLM's fp8 call: quantize, first product (bf16), quantize, second product (bf16)."""
    from moegate.kernels.quant import dequantize_activation, fp8_quantize

    m, top_k = ids.shape
    n = w2.shape[2]
    xq, xs = fp8_quantize(x, quant)
    xk = dequantize_activation(xq, xs, quant.group_size)[0]
    act = torch.zeros(m, top_k, n)
    for t in range(m):
        for s in range(top_k):
            e = int(ids[t, s]) + (1 if wrong_expert and (t, s) == (0, 0) else 0)
            w1e = dequantize(w1[e : e + 1], s1[e : e + 1], quant)[0]
            h = (xk[t] @ w1e.T).bfloat16().float()
            act[t, s] = (F.silu(h[:n]) * h[n:]).bfloat16().float()
    aq, a_s = fp8_quantize(act.reshape(m * top_k, n), quant)
    mid = dequantize_activation(aq, a_s, quant.group_size)[0].reshape(m, top_k, n)
    out = torch.zeros(m, x.shape[1])
    for t in range(m):
        for s in range(top_k):
            if drop_output_expert and (t, s) == (0, 0):
                continue
            e = int(ids[t, s])
            w2e = dequantize(w2[e : e + 1], s2[e : e + 1], quant)[0]
            out[t] += (w[t, s] * (mid[t, s] @ w2e.T)).bfloat16().float()
    return out.bfloat16(), [(xq, xs), (aq, a_s)]


def fp8_problem(seed, quant):
    g = torch.Generator().manual_seed(seed)
    e, m, k, hid, inter = 8, 3, 4, 256, 128
    x = torch.randn(m, hid, generator=g).bfloat16()
    w1, s1 = _fp8_weights(torch.randn(e, 2 * inter, hid, generator=g) / math.sqrt(hid), quant.group_size)
    w2, s2 = _fp8_weights(torch.randn(e, hid, inter, generator=g) / math.sqrt(inter), quant.group_size)
    ids = torch.stack([torch.randperm(e - 1, generator=g)[:k] for _ in range(m)]).to(torch.int32)
    w = torch.rand(m, k, generator=g) + 0.05
    return x, w1, s1, w2, s2, w / w.sum(-1, keepdim=True), ids


FP8_BLOCK_128 = Quant("fp8_w8a8", 128)


@given(seed=st.integers(0, 2**31 - 1), quant=st.sampled_from([PER_TENSOR, FP8_BLOCK_128]))
def test_staged_fp8_check_passes_a_faithful_kernel(seed, quant):
    from moegate.kernels.tolerance import compare_fp8

    x, w1, s1, w2, s2, w, ids = fp8_problem(seed, quant)
    out, quantized = fake_fp8_kernel(x, w1, s1, w2, s2, w, ids, quant)
    result = compare_fp8(out, x, w1, w2, w, ids, quant, s1, s2, quantized)
    assert result.ok, result


@pytest.mark.parametrize("quant", [PER_TENSOR, FP8_BLOCK_128])
@pytest.mark.parametrize("fault", ["wrong_expert", "drop_output_expert", "input_scale"])
def test_staged_fp8_check_names_the_stage_a_fault_is_in(quant, fault):
    from moegate.kernels.tolerance import compare_fp8

    x, w1, s1, w2, s2, w, ids = fp8_problem(7, quant)
    out, quantized = fake_fp8_kernel(
        x,
        w1,
        s1,
        w2,
        s2,
        w,
        ids,
        quant,
        wrong_expert=fault == "wrong_expert",
        drop_output_expert=fault == "drop_output_expert",
    )
    if fault == "input_scale":  # the kernel read its fp8 input under twice the scale it stored
        (xq, xs), mid = quantized
        quantized = [(xq, xs * 2), mid]
    result = compare_fp8(out, x, w1, w2, w, ids, quant, s1, s2, quantized)
    stage = {"wrong_expert": "first product", "drop_output_expert": "second product", "input_scale": "input"}[fault]
    assert not result.ok and result.stages is not None and result.stages[stage] > 1, result


def test_staged_fp8_check_wants_both_quantized_activations():
    from moegate.kernels.tolerance import compare_fp8

    x, w1, s1, w2, s2, w, ids = fp8_problem(1, PER_TENSOR)
    out, quantized = fake_fp8_kernel(x, w1, s1, w2, s2, w, ids, PER_TENSOR)
    with pytest.raises(AssertionError, match="recorded 1 quantized"):
        compare_fp8(out, x, w1, w2, w, ids, PER_TENSOR, s1, s2, quantized[:1])
