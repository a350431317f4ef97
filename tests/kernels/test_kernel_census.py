"""What the census adds to the kernel tier: activations and their limits, biases, the census's K and N, and
calls at the kernel's 32-bit index boundary, each against the torch reference on a CUDA GPU.

Kept to few Triton variants (the tier runs in minutes from a cold cache): two census
shapes (``CENSUS_SHAPES``: gpt-oss-120b at TP4, K 2880 and N 720, neither a multiple of 128; Nemotron-H, N 7688,
which 16 does not divide),
biased quantized weights at one existing shape, and one boundary shape. Every
check is the reference's tolerance rule (``moegate.kernels.tolerance``), plus the path the
spec requires and, for the toggled placement, bitwise equality of the two paths.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moegate.core import profiles
from moegate.core.case import ALL_PLACEMENTS, ENTRYPOINTS, MoECase, Placement
from moegate.core.index_width import INT32_LIMIT, kernel_extent, tokens_at_kernel_boundary
from moegate.core.spec import expected_path
from moegate.kernels.check import run_checked
from moegate.strategies.kernels import biased_quant_cases, census_kernel_cases
from tests.support.kernels import FP8

entrypoints = pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
HOST = st.sampled_from([p for p in ALL_PLACEMENTS if p.host_resident])
DEVICE = Placement(False, False)
few = settings(max_examples=min(12, profiles.kernel_examples()))
"""At most 12 examples a property and entrypoint (the ``nightly`` profile's count is larger: it keeps 12 here too)."""


@entrypoints
@few
@given(data=st.data())
def test_census_activations_biases_and_shapes_match_the_reference(cuda_target, bank, entrypoint, data):
    case = data.draw(census_kernel_cases(entrypoint), label="case")
    result = run_checked(cuda_target, bank, case, entrypoint)
    assert result.path == expected_path(case, entrypoint).path.value, result.describe()
    assert result.closeness.ok, "output outside the tolerance of moegate.kernels.tolerance:\n" + result.describe()


@entrypoints
@few
@given(data=st.data())
def test_naive_and_sorted_agree_bitwise_with_biases_and_clamps(cuda_target, bank, entrypoint, data):
    """Residency toggles the path (naive region, census shapes): both outputs within tolerance and equal."""
    case = data.draw(census_kernel_cases(entrypoint, placement=DEVICE, bias=True), label="case")
    case = replace(case, num_tokens=1)  # 1 * top-4 * 4 <= 128 experts: the naive region
    host = data.draw(HOST, label="host placement")
    naive = run_checked(cuda_target, bank, case, entrypoint)
    sorted_ = run_checked(cuda_target, bank, replace(case, placement=host), entrypoint)
    assert (naive.path, sorted_.path) == ("naive", "sorted"), naive.describe() + "\n" + sorted_.describe()
    assert naive.closeness.ok and sorted_.closeness.ok, naive.describe() + "\n" + sorted_.describe()
    assert torch.equal(naive.output, sorted_.output), naive.describe()


@entrypoints
@few
@given(data=st.data())
def test_biases_with_quantized_weights_match_the_reference(cuda_target, bank, entrypoint, data):
    if entrypoint == "modular" and not FP8:
        pytest.skip("the modular entrypoint runs biased quantized weights as fp8 only: needs fp8 tensor cores")
    case = data.draw(biased_quant_cases(entrypoint, fp8=FP8), label="case")
    result = run_checked(cuda_target, bank, case, entrypoint)
    assert result.closeness.ok, result.describe()


BOUNDARY_SHAPE = (8, 128, 2048, 2)
"""(experts, hidden, intermediate, top_k): w13 rows 4,096, 2 ids a token: the boundary at 262,144 tokens."""


@entrypoints
@pytest.mark.parametrize("side", [0, 1], ids=["last-fitting", "first-past"])
def test_calls_at_the_kernels_32_bit_index_boundary_match_the_reference(cuda_target, bank, entrypoint, side):
    """The largest offset at 2**31 - 1 and just past it: vLLM widens the row index, so both are right.

    About 10 GiB of GPU memory: the intermediate cache alone holds 2**31 bfloat16 values.
    """
    free, _ = torch.cuda.mem_get_info()
    if free < 16 * 2**30:
        pytest.skip(f"needs 16 GiB of free GPU memory for a call at the 32-bit boundary, {free / 2**30:.1f} GiB free")
    experts, hidden, inter, top_k = BOUNDARY_SHAPE
    tokens = tokens_at_kernel_boundary(top_k, 2 * inter, side)
    case = MoECase(tokens, top_k, experts, hidden=hidden, intermediate=inter, dtype="bfloat16")
    assert (kernel_extent(case) > INT32_LIMIT) == (side == 1)
    result = run_checked(cuda_target, bank, case, entrypoint)
    assert result.path == "sorted" and result.closeness.ok, result.describe()
    torch.cuda.empty_cache()
