"""The draws of tests/kernels/test_kernel_fp8_paths.py on a CPU: their inputs, the reference, and the staged fp8
check against a CPU stand-in for vLLM's call (``fake_call``), as it is and with the fault each GPU test catches."""

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


def fake_call(case: MoECase, t: CaseTensors, without: frozenset[str] = frozenset(), a2: torch.Tensor | None = None):
    """(bfloat16 output, [(input q, scale), (activation q, scale)]); a static scale comes back as given (0-D)."""
    q, s1, s2 = case.quant, t.w1_scale, t.w2_scale
    assert q is not None and s1 is not None and s2 is not None
    a1, a2 = t.a1_scale, t.a2_scale if a2 is None else a2
    (m, top_k), n, ids = t.topk_ids.shape, t.w2.shape[2], t.topk_ids.long()
    xq, xs = fp8_quantize(t.hidden_states, q, a1)
    xs = xs if a1 is None else a1
    xk, act = dequantize_activation(xq, xs, q.group_size)[0], torch.zeros(m, top_k, n)
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = (xk[tok] @ dequantize(t.w1[e : e + 1], s1[e : e + 1], q)[0].T).bfloat16().float()
        act[tok, slot] = activations.apply(h, case.activation, without).bfloat16().float()
    aq, a_s = fp8_quantize(act.reshape(m * top_k, n), q, a2)
    a_s = a_s if a2 is None else a2
    mid, out = dequantize_activation(aq, a_s, q.group_size)[0].reshape(m, top_k, n), torch.zeros(m, xk.shape[1])
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        y = t.topk_weights[tok, slot].unsqueeze(1) * (
            mid[tok, slot] @ dequantize(t.w2[e : e + 1], s2[e : e + 1], q)[0].T
        )
        out.index_add_(0, tok, y.bfloat16().float())
    return out.bfloat16(), [(xq, xs), (aq, a_s)]


def staged(case: MoECase, t: CaseTensors, call: tuple[torch.Tensor, list]) -> Closeness:
    assert case.quant is not None and t.w1_scale is not None and t.w2_scale is not None
    x, w1, w2, q = t.hidden_states, t.w1, t.w2, case.quant
    return compare_fp8(call[0], x, w1, w2, t.topk_weights, t.topk_ids, q, t.w1_scale, t.w2_scale, call[1], activation=case.activation)  # fmt: skip


@few
@given(case=clamped_block_fp8_cases())
def test_clamped_block_fp8_draws_make_the_clamp_matter_and_the_check_catches_a_call_that_drops_it(case):
    assert (case.quant, case.activation.name) == (Quant("fp8_w8a8", 128), "silu") and case.activation.limit
    t, _, _ = BANK.inputs(case)
    mattered = conditions.mattered(case, t)
    assert mattered[activations.GATE_CLAMP] or mattered[activations.UP_CLAMP], mattered
    assert not torch.allclose(reference_for(case, t).output, reference_for(case, t, NO_CLAMP).output)
    assert (faithful := staged(case, t, fake_call(case, t))).ok, faithful
    dropped = staged(case, t, fake_call(case, t, NO_CLAMP))  # vLLM #57984's fused kernel: no clamp
    assert not dropped.ok and dropped.stages is not None and dropped.stages["first product"] > 1, dropped


@few
@given(case=static_fp8_cases())
def test_static_fp8_draws_carry_0d_scales_the_reference_and_the_check_use(case):
    t, _, _ = BANK.inputs(case)
    assert t.a1_scale is not None and t.a2_scale is not None and (t.a1_scale.ndim, t.a2_scale.ndim) == (0, 0)
    assert float(t.a1_scale) * FP8_MAX >= float(t.hidden_states.float().abs().max())  # the input never saturates
    dynamic = dataclasses.replace(t, a1_scale=None, a2_scale=None)
    assert not torch.equal(reference_for(case, t).output, reference_for(case, dynamic).output)
    assert (faithful := staged(case, t, fake_call(case, t))).ok, faithful
    small = fake_call(case, t, a2=t.a2_scale / 64)  # a scale too small: the kernel saturates, the check follows
    assert small[1][1][0].float().abs().max().item() == FP8_MAX and (result := staged(case, t, small)).ok, result


def test_static_quantization_divides_by_the_scale_and_clamps_to_the_fp8_range():
    x = torch.tensor([[0.5, -1.0, 100.0, -100.0]])
    q, s = fp8_quantize(x, Quant("fp8_w8a8", 0, static_scales=True), torch.tensor(0.125))
    assert s.shape == (1,) and q.float().tolist() == [[4.0, -8.0, FP8_MAX, -FP8_MAX]]
    with pytest.raises(ValueError, match="per-tensor"):
        fp8_quantize(x, Quant("fp8_w8a8", 128), torch.tensor(0.125))
