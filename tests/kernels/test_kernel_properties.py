"""Kernel properties on a CUDA GPU, through both entrypoints, with real UVA host-resident weights.

Each property draws the cases its claim covers (``moegate.strategies.kernels``) and runs
them on cached weights (``moegate.kernels.inputs``). Host-resident weights are
pinned host memory behind vLLM's own UVA view, marked as the UVA offloader
marks them, so the kernel reads them over PCIe.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from moegate.core.case import ALL_PLACEMENTS, ENTRYPOINTS, ExpertMap, Placement
from moegate.core.spec import expected_path
from moegate.kernels.check import run_checked
from moegate.strategies.kernels import kernel_cases
from tests.support.kernels import FP8, FP8_SKIP, QUANT_FAMILY, kernel_settings

HOST = st.sampled_from([p for p in ALL_PLACEMENTS if p.host_resident])
DEVICE = Placement(False, False)
entrypoints = pytest.mark.parametrize("entrypoint", ENTRYPOINTS)


@entrypoints
@kernel_settings
@given(data=st.data())
def test_output_matches_reference(cuda_target, bank, warm, entrypoint, data):
    """Every placement, expert maps, wNa16 and fp8 weights (where supported): within the stated tolerance."""
    case = data.draw(kernel_cases(entrypoint, expert_map=None, quant=None, schemes=QUANT_FAMILY), label="case")
    result = run_checked(cuda_target, bank, case, entrypoint)
    assert result.closeness.ok, "output outside the tolerance of moegate.kernels.tolerance:\n" + result.describe()


@entrypoints
@kernel_settings
@given(data=st.data())
def test_host_resident_weights_take_sorted_path_on_gpu(cuda_target, bank, warm, entrypoint, data):
    """Real UVA weights (w13, w2 or both on the host): sorted, and the output is still right."""
    case = data.draw(kernel_cases(entrypoint, placement=HOST, expert_map=False), label="case")
    result = run_checked(cuda_target, bank, case, entrypoint)
    assert result.closeness.ok, result.describe()
    assert result.path == "sorted", (
        f"host-resident weights took {result.path}; spec: {expected_path(case, entrypoint)}\n{result.describe()}"
    )


@entrypoints
@kernel_settings
@given(data=st.data())
def test_naive_and_sorted_paths_give_the_same_output(cuda_target, bank, warm, entrypoint, data):
    """Same inputs, naive-region case: device weights (naive) vs host-resident weights (sorted).

    Residency is the toggle, so on a release without the host rule both runs are
    naive and the property fails on the path, saying so. The outputs must be
    bitwise equal: each output element's reduction order depends only on the
    K tiling of the kernel config, which both paths share at the same token count.
    """
    case = data.draw(kernel_cases(entrypoint, placement=DEVICE, region="naive", expert_map=False), label="case")
    host = data.draw(HOST, label="host placement")
    naive = run_checked(cuda_target, bank, case, entrypoint)
    sorted_ = run_checked(cuda_target, bank, replace(case, placement=host), entrypoint)
    assert naive.path == "naive", naive.describe()
    assert sorted_.path == "sorted", f"host-resident weights did not force the sorted path\n{sorted_.describe()}"
    assert naive.closeness.ok and sorted_.closeness.ok, naive.describe() + "\n" + sorted_.describe()
    diff = (naive.output.float() - sorted_.output.float()).abs().max().item()
    assert torch.equal(naive.output, sorted_.output), (
        f"naive and sorted differ (max |diff| {diff:.3g})\n" + naive.describe()
    )


@entrypoints
@kernel_settings
@given(data=st.data())
def test_host_and_device_weights_give_the_same_output(cuda_target, bank, warm, entrypoint, data):
    """Placement alone (the path held equal: outside the naive region, or an expert map): bitwise equal."""
    case = data.draw(kernel_cases(entrypoint, placement=DEVICE, region="outside", expert_map=None), label="case")
    host = data.draw(HOST, label="host placement")
    dev = run_checked(cuda_target, bank, case, entrypoint)
    uva = run_checked(cuda_target, bank, replace(case, placement=host), entrypoint)
    assert dev.path == uva.path == "sorted", dev.describe() + "\n" + uva.describe()
    assert torch.equal(dev.output, uva.output), "host-resident and device weights differ\n" + uva.describe()


@entrypoints
@kernel_settings
@given(data=st.data())
def test_expert_parallel_ranks_sum_to_the_whole_layer(cuda_target, bank, warm, entrypoint, data):
    """Each rank's output (remote experts zero) is within tolerance, and the ranks' sum matches the no-EP layer."""
    case = data.draw(kernel_cases(entrypoint, expert_map=True), label="case")
    size = case.expert_map.ep_size
    total = None
    for rank in range(size):
        part_case = replace(case, expert_map=ExpertMap(ep_size=size, ep_rank=rank))
        part = run_checked(cuda_target, bank, part_case, entrypoint)
        assert part.closeness.ok, part.describe()
        assert part.path == "sorted", part.describe()
        total = part.output.float() if total is None else total + part.output.float()
    assert total is not None  # a valid expert map has a rank 0: the loop ran
    whole = run_checked(cuda_target, bank, replace(case, expert_map=None), entrypoint)
    # each rank's rounding budget adds up: compare the sum against size tolerances of the whole
    err = (total - whole.output.float()).abs().max().item()
    bound = size * max(whole.closeness.max_abs_err, 1e-30) + size * 4 * 2**-8 * whole.output.float().abs().max().item()
    assert err <= bound, (
        f"sum over {size} ranks differs from the whole layer by {err:.3g} > {bound:.3g}\n" + whole.describe()
    )


@pytest.mark.skipif(not FP8, reason=FP8_SKIP)
@entrypoints
@kernel_settings
@given(data=st.data())
def test_fp8_weights_on_every_path_and_placement(cuda_target, bank, warm, entrypoint, data):
    """fp8_w8a8 (per-tensor and 128 x 128 blocks): device weights take the spec's path, host weights sorted,
    both within the tolerance, and the outputs bitwise equal (the same kernel config and reduction order,
    and the same dynamic activation scales, on both paths).
    """
    case = data.draw(
        kernel_cases(entrypoint, placement=DEVICE, quant=True, schemes="fp8", expert_map=False), label="case"
    )
    host = data.draw(HOST, label="host placement")
    dev = run_checked(cuda_target, bank, case, entrypoint)
    uva = run_checked(cuda_target, bank, replace(case, placement=host), entrypoint)
    assert dev.closeness.ok and uva.closeness.ok, dev.describe() + "\n" + uva.describe()
    assert dev.path == expected_path(case, entrypoint).path.value, dev.describe()
    assert uva.path == "sorted", f"host-resident fp8 weights took {uva.path}\n{uva.describe()}"
    diff = (dev.output.float() - uva.output.float()).abs().max().item()
    assert torch.equal(dev.output, uva.output), (
        f"fp8 {dev.path} (device) and sorted (host) outputs differ (max |diff| {diff:.3g})\n" + uva.describe()
    )
