"""Two kernel-tier draws no other test makes, each for a real vLLM bug the tier let through (issue 45).

- int4 (GPTQ/AWQ) weights at the legacy entrypoint with K 2880, not a multiple of 128, on vLLM's CUDA wNa16
  kernel (``moegate.strategies.kernels.wna16_off_grid_cases``): the kernel needs a BLOCK_SIZE_K that divides K,
  and vLLM's heuristic starts at 128 (vLLM #30210). Every other int4 draw has K a multiple of 128.
- fused shared-expert rows at both entrypoints (``shared_expert_kernel_cases``): the modular call passes the
  routed count as vLLM's layer does, so the experts must count w1's rows for the shared ids to reach the
  alignment (vLLM #51632); no other kernel-tier test draws shared rows.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moegate.core import profiles
from moegate.core.case import ENTRYPOINTS
from moegate.kernels.check import run_checked
from moegate.strategies.kernels import shared_expert_kernel_cases, wna16_off_grid_cases

few = settings(max_examples=min(6, profiles.kernel_examples()))


@few
@given(data=st.data())
def test_int4_weights_with_k_off_the_multiples_of_128_match_the_reference(cuda_target, bank, data):
    """K 2880, group size 64, at most six tokens per expert: vLLM's CUDA wNa16 kernel runs and is within tolerance."""
    case = data.draw(wna16_off_grid_cases(), label="case")
    result = run_checked(cuda_target, bank, case, "legacy")
    assert result.path == "sorted", result.describe()  # grouped wNa16 always aligns
    assert result.closeness.ok, "output outside the tolerance of moegate.kernels.tolerance:\n" + result.describe()


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
@few
@given(data=st.data())
def test_fused_shared_expert_rows_reach_the_output(cuda_target, bank, warm, entrypoint, data):
    """One or two shared rows (weight 1, every token): within tolerance of the reference, which adds them in full."""
    case = data.draw(shared_expert_kernel_cases(entrypoint), label="case")
    result = run_checked(cuda_target, bank, case, entrypoint)
    assert result.closeness.ok, "output outside the tolerance of moegate.kernels.tolerance:\n" + result.describe()
