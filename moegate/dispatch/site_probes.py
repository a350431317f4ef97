"""Dispatch sites beyond the two entrypoints, each driven on its own to its decision or its alignment.

The census (``moegate.census``) finds and classifies every caller of the assignment
decision and of the alignment. Those that a CPU can drive up to that point are run
here, decision-only, through the same recorders as the entrypoints
(``VllmTarget.instrument`` puts them into the site's own module, which imported the
aligner and the launchers by name), and report what they did:

- ``k2_horizon``: K2-Horizon's one-product MoVA experts (``fused_mova_impl``), a reviewed
  exception: it calls the decision without the host flag;
- ``dots3_vision``: the dots3 NOTE vision encoder's block-fp8 MoE (``note_vision_fused_moe_fp8``),
  the other reviewed exception (its fp8 input quantizer, a GPU kernel, is stood in for);
- ``marlin``: ``fused_marlin_moe`` (4-bit Marlin weights), which always aligns;
- ``mxfp8_native``: ``fused_moe_mxfp8_native``, which always aligns and counts fused
  shared rows like the modular Triton experts;
- ``batched_marlin``: ``batched_fused_marlin_moe``, the batched (expert-major) format, whose
  alignment takes per-expert token counts (there are no ids to be naive about);
- ``nvfp4_emulation``: ``Nvfp4QuantizationEmulationTritonExperts.apply``, the nvfp4 experts
  emulated with the Triton kernel, built as vLLM's layer builds them.

Each takes a case and returns the ``Observation``; the tests compare it with the
site's classification (``tests/dispatch/test_dispatch_sites.py``). Weights are the
case's decision-only placeholders where the site reads only shapes, small real
tensors where it checks contiguity.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import torch

from moegate.core.case import MoECase
from moegate.core.tensors import decision_tensors
from moegate.dispatch import names
from moegate.dispatch.recorders import Observation
from moegate.dispatch.target import CPU_KERNEL_CONFIG, VllmTarget

K2_HORIZON = "vllm.model_executor.models.k2_horizon"
DOTS3_VISION = "vllm.models.dots3_note.nvidia.vision_moe"
MARLIN = names.FUSED_MOE_PKG + ".experts.marlin_moe"
MXFP8_NATIVE = names.FUSED_MOE_PKG + ".experts.mxfp8_native_moe"
NVFP4_EMULATION = names.FUSED_MOE_PKG + ".experts.nvfp4_emulation_moe"
FP8_BLOCK = 128


_ALONE: dict[str, Any] = {}


def _module(target: VllmTarget, dotted: str, *, alone: bool = False) -> Any:
    """The site's module, instrumented. ``alone``: loaded from its file without its package's ``__init__``
    (the dots3 package imports its whole multimodal model, which needs CUDA's runtime bindings), as a
    private copy that only the probe calls."""
    if not alone:
        mod = importlib.import_module(dotted)
    elif dotted in _ALONE:
        mod = _ALONE[dotted]
    else:
        spec = importlib.util.find_spec(dotted.rsplit(".", 1)[0].split(".")[0])
        assert spec is not None and spec.submodule_search_locations
        root = next(iter(spec.submodule_search_locations))
        path = f"{root}/{dotted.split('.', 1)[1].replace('.', '/')}.py"
        file_spec = importlib.util.spec_from_file_location("moegate_probe_" + dotted.replace(".", "_"), path)
        assert file_spec is not None and file_spec.loader is not None
        mod = _ALONE[dotted] = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(mod)
    target.instrument(mod)
    return mod


def k2_horizon(target: VllmTarget, case: MoECase) -> Observation:
    """``fused_mova_impl``: one product (w13 only); w13's residency is the case's."""
    mod = _module(target, K2_HORIZON)
    t = decision_tensors(case, target.device)
    w1 = target.mark(t.w1, case.placement.w13_host)
    return target.observe(
        lambda: mod.fused_mova_impl(
            dict(CPU_KERNEL_CONFIG),
            t.hidden_states,
            w1,
            t.topk_weights,
            t.topk_ids,
            global_num_experts=case.total_experts,
            expert_map=t.expert_map,
        )
    )


def dots3_vision(target: VllmTarget, case: MoECase) -> Observation:
    """``note_vision_fused_moe_fp8``: bfloat16 input, fp8 weights in 128 x 128 blocks, no expert map."""
    dev = target.device
    if case.expert_map is not None or case.dtype != "bfloat16":
        raise ValueError("the dots3 vision MoE takes bfloat16 inputs and no expert map")
    mod = _module(target, DOTS3_VISION, alone=True)
    t = decision_tensors(case, target.device)
    fp8 = torch.float8_e4m3fn
    rows, k, n = case.w13_rows, case.hidden, case.intermediate
    e = case.local_experts
    w13 = target.mark(torch.empty((1, 1, k), dtype=fp8, device=dev).expand(e, rows, k), case.placement.w13_host)
    w2 = target.mark(torch.empty((1, 1, n), dtype=fp8, device=dev).expand(e, k, n), case.placement.w2_host)
    s13 = torch.ones((e, -(-rows // FP8_BLOCK), -(-k // FP8_BLOCK)), device=dev)
    s2 = torch.ones((e, -(-k // FP8_BLOCK), -(-n // FP8_BLOCK)), device=dev)

    def quantize(x: torch.Tensor, group: int, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty(x.shape, dtype=fp8, device=x.device), torch.ones(
            (x.shape[0], -(-x.shape[-1] // group)), device=x.device
        )

    real = mod.per_token_group_quant_fp8
    mod.per_token_group_quant_fp8 = quantize  # a GPU kernel before the decision; restored below
    try:
        return target.observe(
            lambda: mod.note_vision_fused_moe_fp8(t.hidden_states, w13, w2, t.topk_weights, t.topk_ids, s13, s2)
        )
    finally:
        mod.per_token_group_quant_fp8 = real


def marlin(target: VllmTarget, case: MoECase) -> Observation:
    """``fused_marlin_moe`` with 4-bit (uint4b8) weights, stopped at its alignment."""
    dev = target.device
    mod = _module(target, MARLIN)
    scalar_types = importlib.import_module("vllm.scalar_type").scalar_types
    t = decision_tensors(case, target.device)
    e, k, n = case.local_experts, case.hidden, case.intermediate
    if k % 16 or n % 16:
        raise ValueError("Marlin tiles K and N by 16")
    w1 = target.mark(torch.zeros((e, k // 16, 2 * n * 2), dtype=torch.int32, device=dev), case.placement.w13_host)
    w2 = target.mark(torch.zeros((e, n // 16, 2 * k), dtype=torch.int32, device=dev), case.placement.w2_host)
    hidden = torch.zeros((case.num_tokens, k), dtype=torch.bfloat16, device=dev)
    scales = (
        torch.ones((e, 1, 2 * n), dtype=torch.bfloat16, device=dev),
        torch.ones((e, 1, k), dtype=torch.bfloat16, device=dev),
    )
    return target.observe(
        lambda: mod.fused_marlin_moe(
            hidden,
            w1,
            w2,
            None,
            None,
            *scales,
            t.topk_weights,
            t.topk_ids,
            quant_type_id=scalar_types.uint4b8.id,
            global_num_experts=case.total_experts,
            expert_map=t.expert_map,
        ),
        stop_at_align=True,
    )


def mxfp8_native(target: VllmTarget, case: MoECase) -> Observation:
    """``fused_moe_mxfp8_native`` (fp8 weights with 32-wide scales), stopped at its alignment."""
    dev = target.device
    mod = _module(target, MXFP8_NATIVE)
    t = decision_tensors(case, target.device)
    fp8 = torch.float8_e4m3fn
    e, rows, k, n = case.local_experts, case.w13_rows, case.hidden, case.intermediate
    w13 = target.mark(torch.empty((1, 1, k), dtype=fp8, device=dev).expand(e, rows, k), case.placement.w13_host)
    w2 = target.mark(torch.empty((1, 1, n), dtype=fp8, device=dev).expand(e, k, n), case.placement.w2_host)
    s13 = torch.empty((1, 1, k // 32), dtype=torch.uint8, device=dev).expand(e, rows, k // 32)
    s2 = torch.empty((1, 1, n // 32), dtype=torch.uint8, device=dev).expand(e, k, n // 32)
    hidden = t.hidden_states.to(torch.bfloat16)
    return target.observe(
        lambda: mod.fused_moe_mxfp8_native(
            hidden,
            w13,
            s13,
            w2,
            s2,
            t.topk_weights,
            t.topk_ids,
            alpha=1.0,
            beta=0.0,
            limit=None,
            global_num_experts=case.num_experts,
            expert_map=t.expert_map,
        ),
        stop_at_align=True,
    )


def batched_marlin(target: VllmTarget, case: MoECase) -> Observation:
    """``batched_fused_marlin_moe``: each expert's tokens in its own batch row; stopped at its alignment."""
    dev = target.device
    mod = _module(target, MARLIN)
    scalar_types = importlib.import_module("vllm.scalar_type").scalar_types
    e, k, n = case.local_experts, case.hidden, case.intermediate
    per_expert = max(1, case.num_tokens)
    hidden = torch.zeros((e, per_expert, k), dtype=torch.bfloat16, device=dev)
    counts = torch.full((e,), min(per_expert, case.num_tokens), dtype=torch.int32, device=dev)
    w1 = target.mark(torch.zeros((e, k // 16, 2 * n * 2), dtype=torch.int32, device=dev), case.placement.w13_host)
    w2 = target.mark(torch.zeros((e, n // 16, 2 * k), dtype=torch.int32, device=dev), case.placement.w2_host)
    scales = (
        torch.ones((e, 1, 2 * n), dtype=torch.bfloat16, device=dev),
        torch.ones((e, 1, k), dtype=torch.bfloat16, device=dev),
    )
    return target.observe(
        lambda: mod.batched_fused_marlin_moe(
            hidden, counts, w1, w2, None, None, *scales, quant_type_id=scalar_types.uint4b8.id
        ),
        stop_at_align=True,
    )


def nvfp4_emulation(target: VllmTarget, case: MoECase) -> Observation:
    """``Nvfp4QuantizationEmulationTritonExperts.apply`` on packed nvfp4 placeholders, stopped at its alignment."""
    dev = target.device
    mod = _module(target, NVFP4_EMULATION)
    cfgmod = importlib.import_module(names.FUSED_MOE_CONFIG)
    e, k, n = case.local_experts, case.hidden, case.intermediate
    one = torch.ones(e, device=dev)
    quant = cfgmod.nvfp4_moe_quant_config(
        g1_alphas=one,
        g2_alphas=one,
        a1_gscale=one,
        a2_gscale=one,
        w1_scale=torch.ones(e, 2 * n, k // 16, device=dev),
        w2_scale=torch.ones(e, k, n // 16, device=dev),
    )
    moe = cfgmod.FusedMoEConfig(
        num_experts=case.num_experts,
        experts_per_token=case.top_k,
        hidden_dim=k,
        intermediate_size=n,
        num_local_experts=e,
        num_logical_experts=case.num_experts,
        moe_parallel_config=cfgmod.FusedMoEParallelConfig.make_no_parallel(),
        activation=target.fm.MoEActivation.SILU,
        in_dtype=torch.bfloat16,
        device=target.device,
        routing_method=cfgmod.RoutingMethodType.TopK,
        max_num_tokens=512,
    )
    experts = mod.Nvfp4QuantizationEmulationTritonExperts(moe, quant)
    t = decision_tensors(case, target.device)
    w1 = target.mark(torch.zeros((e, 2 * n, k // 2), dtype=torch.uint8, device=dev), case.placement.w13_host)
    w2 = target.mark(torch.zeros((e, k, n // 2), dtype=torch.uint8, device=dev), case.placement.w2_host)
    m, cols = case.num_tokens, case.topk_columns
    ws13 = torch.empty(m * cols * max(2 * n, k), dtype=torch.bfloat16, device=dev)
    ws2 = torch.empty(m * cols * max(2 * n, k), dtype=torch.bfloat16, device=dev)
    out = torch.zeros((m, k), dtype=torch.bfloat16, device=dev)
    hidden = torch.zeros((m, k), dtype=torch.bfloat16, device=dev)
    silu = target.fm.MoEActivation.SILU
    return target.observe(
        lambda: experts.apply(
            out,
            hidden,
            w1,
            w2,
            t.topk_weights,
            t.topk_ids,
            silu,
            case.total_experts,
            t.expert_map,
            None,
            None,
            ws13,
            ws2,
            None,
            False,
        ),
        stop_at_align=True,
    )


PROBES: dict[str, Callable[[VllmTarget, MoECase], Observation]] = {
    "model_executor/models/k2_horizon.py::fused_mova_impl": k2_horizon,
    "models/dots3_note/nvidia/vision_moe.py::note_vision_fused_moe_fp8": dots3_vision,
    "model_executor/layers/fused_moe/experts/marlin_moe.py::fused_marlin_moe": marlin,
    "model_executor/layers/fused_moe/experts/mxfp8_native_moe.py::fused_moe_mxfp8_native": mxfp8_native,
    "model_executor/layers/fused_moe/experts/marlin_moe.py::batched_fused_marlin_moe": batched_marlin,
    "model_executor/layers/fused_moe/experts/nvfp4_emulation_moe.py::Nvfp4QuantizationEmulationTritonExperts.apply": (
        nvfp4_emulation
    ),
}
"""Site (as the census keys it) -> its probe."""
