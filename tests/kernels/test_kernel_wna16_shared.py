"""Draws for two real vLLM bugs the kernel tier let through (issue 45): int4 at K 2880 on the CUDA wNa16 kernel
(vLLM #30210), fused shared-expert rows at both entrypoints (vLLM #51632)."""

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
    case = data.draw(wna16_off_grid_cases(), label="case")
    result = run_checked(cuda_target, bank, case, "legacy")
    assert result.closeness.ok, result.describe()


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
@few
@given(data=st.data())
def test_fused_shared_expert_rows_reach_the_output(cuda_target, bank, warm, entrypoint, data):
    case = data.draw(shared_expert_kernel_cases(entrypoint), label="case")
    result = run_checked(cuda_target, bank, case, entrypoint)
    assert result.closeness.ok, result.describe()
