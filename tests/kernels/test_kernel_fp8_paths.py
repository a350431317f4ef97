"""Two fp8 paths the kernel tier's other properties do not take, each against the torch reference on a CUDA GPU.

- Block-fp8 (128 x 128) weights with a clamp-limited SiLU at the modular entrypoint: vLLM's
  ``TritonExperts`` must leave its fused SiLU-and-mul + fp8 block-quant kernel, which has no clamp,
  for the clamping path (vLLM #57984). The inputs make the clamps bind (``activations.INPUT_GAIN``),
  and the staged fp8 check compares the kernel's quantized activation with the clamped reference.
- Static per-tensor fp8 activation scales given as 0-D tensors, as vLLM's FP8 MoE methods build them
  with ``.max()`` over per-expert input scales: the launcher must reshape them (vLLM #40857).

Few examples at one shape (``FP8_PATH_SHAPE``): a handful of Triton variants, minutes from a cold cache.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moegate.core import profiles
from moegate.core.case import ENTRYPOINTS
from moegate.kernels.check import run_checked
from moegate.strategies.kernels import clamped_block_fp8_cases, static_fp8_cases
from tests.support.kernels import FP8, FP8_SKIP

few = settings(max_examples=min(6, profiles.kernel_examples()))
"""At most 6 examples a property and entrypoint: one shape, so each adds few Triton variants."""

needs_fp8 = pytest.mark.skipif(not FP8, reason=FP8_SKIP)


@needs_fp8
@few
@given(data=st.data())
def test_block_fp8_with_a_clamped_silu_matches_the_reference_at_the_modular_entrypoint(cuda_target, bank, data):
    case = data.draw(clamped_block_fp8_cases(), label="case")
    result = run_checked(cuda_target, bank, case, "modular")
    assert result.closeness.ok, result.describe()


@needs_fp8
@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
@few
@given(data=st.data())
def test_static_0d_fp8_activation_scales_match_the_reference(cuda_target, bank, entrypoint, data):
    case = data.draw(static_fp8_cases(), label="case")
    result = run_checked(cuda_target, bank, case, entrypoint)
    t = result.tensors
    assert t is not None and t.a1_scale is not None and t.a2_scale is not None, "a static case carries its scales"
    assert (t.a1_scale.ndim, t.a2_scale.ndim) == (0, 0), "the scales must reach vLLM as 0-D tensors"
    assert result.closeness.ok, result.describe()
