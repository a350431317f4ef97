"""fp8 paths the other kernel properties do not take, against the torch reference on a CUDA GPU: block-fp8 with a
clamped SiLU at the modular entrypoint (vLLM #57984), block-fp8 with gpt-oss's SwiGLU handed over in the quantization
config too, and static 0-D activation scales (vLLM #40857). One shape, few examples: a handful of Triton variants."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moegate.core import profiles
from moegate.core.case import ENTRYPOINTS
from moegate.kernels.check import run_checked
from moegate.strategies.kernels import block_fp8_oai_cases, clamped_block_fp8_cases, static_fp8_cases
from tests.support.kernels import FP8, FP8_SKIP

few = settings(max_examples=min(6, profiles.kernel_examples()))
needs_fp8 = pytest.mark.skipif(not FP8, reason=FP8_SKIP)


@needs_fp8
@few
@given(data=st.data())
def test_block_fp8_with_a_clamped_silu_matches_the_reference_at_the_modular_entrypoint(cuda_target, bank, data):
    result = run_checked(cuda_target, bank, data.draw(clamped_block_fp8_cases(), label="case"), "modular")
    assert result.closeness.ok, result.describe()


@needs_fp8
@settings(max_examples=min(3, profiles.kernel_examples()))
@given(data=st.data())
def test_block_fp8_with_gpt_oss_swiglu_in_the_quant_config_matches_the_reference_at_the_modular_entrypoint(
    cuda_target, bank, data
):
    """The limit, alpha and beta reach the experts through the fp8 quantization config too, as vLLM's fp8 methods
    pass them (``EntrypointCalls.gemm1_activation``)."""
    result = run_checked(cuda_target, bank, data.draw(block_fp8_oai_cases(), label="case"), "modular")
    assert result.closeness.ok, result.describe()


@needs_fp8
@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
@few
@given(data=st.data())
def test_static_0d_fp8_activation_scales_match_the_reference(cuda_target, bank, entrypoint, data):
    result = run_checked(cuda_target, bank, data.draw(static_fp8_cases(), label="case"), entrypoint)
    t = result.tensors
    assert t is not None and t.a1_scale is not None and t.a2_scale is not None
    assert (t.a1_scale.ndim, t.a2_scale.ndim) == (0, 0), "vLLM's FP8 MoE methods pass 0-D scales"
    assert result.closeness.ok, result.describe()
