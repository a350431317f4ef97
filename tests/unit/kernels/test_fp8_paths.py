"""The fp8 paths of tests/kernels/test_kernel_fp8_paths.py, on a CPU: the draws, their inputs, the reference and the staged check.

A CPU stand-in for vLLM's fp8 call (``fake_call``: quantize, first product rounded to bfloat16, activation,
quantize, second product) runs on the tier's own inputs; the staged check must pass it as it is and fail it
with the fault each GPU test is there to catch (an unclamped activation; see power/real-bugs.toml).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings

from moegate.core.case import MoECase, Quant
from moegate.core.tensors import CaseTensors
from moegate.kernels import activations, conditions
from moegate.kernels.check import reference_for
from moegate.kernels.inputs import WeightBank
from moegate.kernels.quant import FP8_MAX, dequantize, dequantize_activation, fp8_quantize
from moegate.kernels.tolerance import Closeness, compare_fp8
from moegate.strategies.kernels import clamped_block_fp8_cases, static_fp8_cases

BANK = WeightBank(torch.device("cpu"), lambda w: w)
few = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NO_CLAMP = frozenset({activations.GATE_CLAMP, activations.UP_CLAMP})


def fake_call(case: MoECase, t: CaseTensors, *, without: frozenset[str] = frozenset(), a2: torch.Tensor | None = None):
    """vLLM's fp8 call on a CPU: (bfloat16 output, [(input q, scale), (activation q, scale)]) as the adapter records them."""
    quant = case.quant
    assert quant is not None and t.w1_scale is not None and t.w2_scale is not None
    w1_scale, w2_scale = t.w1_scale, t.w2_scale
    g = quant.group_size
    a2 = t.a2_scale if a2 is None else a2
    m, top_k = t.topk_ids.shape
    n = t.w2.shape[2]
    xq, xs = fp8_quantize(t.hidden_states, quant, t.a1_scale)
    xs = t.a1_scale if t.a1_scale is not None else xs  # a static scale comes back as it went in: 0-D
    xk = dequantize_activation(xq, xs, g)[0]
    act = torch.zeros(m, top_k, n)
    ids = t.topk_ids.long()
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = (xk[tok] @ dequantize(t.w1[e : e + 1], w1_scale[e : e + 1], quant)[0].T).bfloat16().float()
        act[tok, slot] = activations.apply(h, case.activation, without).bfloat16().float()
    aq, a_s = fp8_quantize(act.reshape(m * top_k, n), quant, a2)
    a_s = a2 if a2 is not None else a_s
    mid = dequantize_activation(aq, a_s, g)[0].reshape(m, top_k, n)
    out = torch.zeros(m, t.hidden_states.shape[1])
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        y = mid[tok, slot] @ dequantize(t.w2[e : e + 1], w2_scale[e : e + 1], quant)[0].T
        out.index_add_(0, tok, (t.topk_weights[tok, slot].unsqueeze(1) * y).bfloat16().float())
    return out.bfloat16(), [(xq, xs), (aq, a_s)]


def staged(case: MoECase, t: CaseTensors, out: torch.Tensor, quantized: list) -> Closeness:
    assert case.quant is not None and t.w1_scale is not None and t.w2_scale is not None
    return compare_fp8(
        out, t.hidden_states, t.w1, t.w2, t.topk_weights, t.topk_ids, case.quant, t.w1_scale, t.w2_scale, quantized,
        activation=case.activation,
    )  # fmt: skip


# --- block fp8 with a clamped SiLU (vLLM #57984) --------------------------------------------------------------


@few
@given(case=clamped_block_fp8_cases())
def test_clamped_block_fp8_draws_make_the_clamp_matter_and_the_check_catches_a_call_that_drops_it(case):
    assert (case.quant, case.activation.name) == (Quant("fp8_w8a8", 128), "silu") and case.activation.limit
    t, _, _ = BANK.inputs(case)
    mattered = conditions.mattered(case, t)
    assert mattered[activations.GATE_CLAMP] or mattered[activations.UP_CLAMP], mattered
    with_clamp = reference_for(case, t).output
    assert not torch.allclose(with_clamp, reference_for(case, t, NO_CLAMP).output)
    out, quantized = fake_call(case, t)
    faithful = staged(case, t, out, quantized)
    assert faithful.ok, faithful
    out, quantized = fake_call(case, t, without=NO_CLAMP)  # the fused kernel's result: no clamp
    dropped = staged(case, t, out, quantized)
    assert not dropped.ok and dropped.stages is not None and dropped.stages["first product"] > 1, dropped


# --- static per-tensor fp8 with 0-D activation scales (vLLM #40857) -------------------------------------------


@few
@given(case=static_fp8_cases())
def test_static_fp8_draws_carry_0d_scales_the_reference_uses(case):
    t, _, _ = BANK.inputs(case)
    assert t.a1_scale is not None and t.a2_scale is not None
    assert (t.a1_scale.ndim, t.a2_scale.ndim) == (0, 0)
    assert float(t.a1_scale) * FP8_MAX >= float(t.hidden_states.float().abs().max())  # the input never saturates
    static = reference_for(case, t).output
    dynamic = reference_for(case, dataclasses.replace(t, a1_scale=None, a2_scale=None)).output
    assert not torch.equal(static, dynamic)  # the scales given are the ones quantized with
    out, quantized = fake_call(case, t)
    result = staged(case, t, out, quantized)
    assert result.ok, result


@few
@given(case=static_fp8_cases())
def test_a_static_activation_scale_too_small_saturates_in_the_kernel_and_the_check_alike(case):
    t, _, _ = BANK.inputs(case)
    assert t.a2_scale is not None
    small = t.a2_scale / 64
    out, quantized = fake_call(case, t, a2=small)
    assert quantized[1][0].float().abs().max().item() == FP8_MAX  # some activation saturated
    result = staged(case, t, out, quantized)
    assert result.ok, result


def test_static_quantization_divides_by_the_scale_and_clamps_to_the_fp8_range():
    x = torch.tensor([[0.5, -1.0, 100.0, -100.0]])
    q, s = fp8_quantize(x, Quant("fp8_w8a8", 0, static_scales=True), torch.tensor(0.125))
    assert s.shape == (1,) and q.float().tolist() == [[4.0, -8.0, FP8_MAX, -FP8_MAX]]
    with pytest.raises(ValueError, match="per-tensor"):
        fp8_quantize(x, Quant("fp8_w8a8", 128), torch.tensor(0.125))
