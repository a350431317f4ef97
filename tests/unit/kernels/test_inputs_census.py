"""The census's kernel-tier cases, built and judged on a CPU: everything the GPU tests do but vLLM's call.

``tests/kernels/test_kernel_census.py`` runs on a GPU only; here its cases go through the
same weight bank and the same reference and comparison, with the reference's own output
rounded to bfloat16 standing in for the kernel's. So a shape, dtype or layout slip in the
plumbing (an ungated w13, a bias slice, the input gain, fp8 with biases) fails here, not on
the lead's GPU run. The index-width calls are left out: a CPU takes minutes for their reference.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moegate.core.activation import Activation
from moegate.core.case import ENTRYPOINTS, MoECase
from moegate.core.tensors import torch_dtype
from moegate.kernels.check import reference_for
from moegate.kernels.inputs import WeightBank
from moegate.kernels.tolerance import compare
from moegate.strategies.kernels import biased_quant_cases, census_kernel_cases

BANK = WeightBank(torch.device("cpu"), lambda w: w.clone())  # a copy stands in for the pinned UVA view


def _judge_rounded(case) -> None:
    t, w1, _ = BANK.inputs(case)
    assert w1.shape[1] == case.w13_rows and w1.shape[0] == case.local_experts
    if case.bias:
        assert t.w1_bias is not None and t.w1_bias.shape == (case.local_experts, case.w13_rows)
        assert t.w2_bias is not None and t.w2_bias.shape == (case.local_experts, case.hidden)
    ref = reference_for(case, t)
    assert torch.isfinite(ref.output).all()
    dtype = torch_dtype(case.dtype)
    verdict = compare(ref.output.to(dtype), ref, dtype, case.quant, case.activation)
    assert verdict.ok, verdict


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_census_kernel_cases_build_and_their_rounded_reference_passes(entrypoint, data):
    """The census shapes' K and N, with 8 experts instead of 128 (drawing 1.6 GB of weights is the GPU's job), and
    Nemotron-H's N of 7688 as 136, its residue modulo 128 plus a block (what the kernel's blocks and Triton's
    divisibility see of it): its real size costs the CPU half a minute a run."""
    case = replace(data.draw(census_kernel_cases(entrypoint)), num_experts=8)
    if case.intermediate > 4096:
        case = replace(case, intermediate=case.intermediate % 128 + 128)
    if entrypoint == "legacy":
        assert not case.activation.parameterised, "the legacy entrypoint cannot be handed activation parameters"
    _judge_rounded(case)


@pytest.mark.parametrize(("entrypoint", "fp8"), [("legacy", True), ("legacy", False), ("modular", True)])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_biased_quantized_cases_build_and_their_rounded_reference_passes(entrypoint, fp8, data):
    case = data.draw(biased_quant_cases(entrypoint, fp8=fp8))
    assert case.bias and case.quant is not None
    _judge_rounded(case)


def test_a_clamping_activation_scales_every_other_tokens_inputs_and_leaves_the_biases_at_unit_scale():
    """Even tokens at the gain (clamps bind), odd ones at unit scale (alpha matters), biases at unit scale."""
    base = MoECase(64, 4, 8, hidden=256, intermediate=128, bias=True, dtype="bfloat16")
    clamped = MoECase(
        64, 4, 8, hidden=256, intermediate=128, bias=True, dtype="bfloat16", activation=Activation("swigluoai")
    )
    t0, _, _ = BANK.inputs(base)
    t1, _, _ = BANK.inputs(clamped)
    h0, h1 = t0.hidden_states.float(), t1.hidden_states.float()
    assert 7.0 < float(h1[0::2].std() / h0[0::2].std()) < 9.0
    assert 0.9 < float(h1[1::2].std() / h0[1::2].std()) < 1.1
    assert t1.w2_bias is not None and t0.w2_bias is not None and t1.w1_bias is not None
    assert 0.8 < float(t1.w2_bias.float().std()) < 1.2 and 0.8 < float(t1.w1_bias.float().std()) < 1.2
