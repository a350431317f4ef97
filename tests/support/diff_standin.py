"""The differential kernel tier on a CPU: a stand-in for vLLM's fused-MoE experts, and a worker that calls it.

The unit tier cannot launch vLLM's kernels, so a build here is a real interpreter (``moegate.builds.planted``) whose
site holds ``FUSED_MOE_SITE``: a ``fused_experts`` at vLLM's module name that computes the layer on the CPU
with the roundings the GPU kernel makes (the first product, silu and the product with the up half as vLLM's CUDA
op rounds them, each expert's weighted output in the epilogue, the top-k sum in the output's dtype, in order).
Planted changes act on it as on vLLM's own (``plant_experts.py``). ``DiffStandIn`` is what each build's worker
runs: that ``fused_experts`` on the case's inputs, then the tier's own payload. Only the unit tests use it; it is
never a GPU result.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

import torch

from moegate.core.case import MoECase
from moegate.core.spec import expected_path
from moegate.core.tensors import torch_dtype
from moegate.kernels.check import KernelResult, StageClock, reference_for
from moegate.kernels.differential import Fingerprints, payload
from moegate.kernels.inputs import WeightBank
from moegate.kernels.tolerance import compare

FUSED_MOE = "vllm.model_executor.layers.fused_moe.fused_moe"

FUSED_MOE_SITE = """
import torch


def apply_moe_activation(activation, output, input, **kwargs):
    d = input.shape[-1] // 2
    gate = input[..., :d].float()
    silu = (gate * gate.sigmoid()).to(input.dtype)  # vLLM's CUDA op rounds silu(gate), then the product
    output.copy_((silu.float() * input[..., d:].float()).to(output.dtype))
    return output


def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, activation="silu",
                  apply_router_weight_on_input=False, global_num_experts=-1, expert_map=None):
    dtype = hidden_states.dtype
    m, k = hidden_states.shape
    slots = torch.zeros(m, topk_ids.shape[1], k, dtype=dtype)
    for e in topk_ids.unique().tolist():
        tok, slot = (topk_ids == e).nonzero(as_tuple=True)
        h = (hidden_states[tok].float() @ w1[e].float().T).to(dtype)
        act = torch.empty(h.shape[0], h.shape[1] // 2, dtype=dtype)
        apply_moe_activation(activation, act, h)
        slots[tok, slot] = ((act.float() @ w2[e].float().T) * topk_weights[tok, slot].unsqueeze(1)).to(dtype)
    out = slots[:, 0].clone()
    for j in range(1, slots.shape[1]):  # moe_sum: in the output's dtype, slot by slot
        out = (out.float() + slots[:, j].float()).to(dtype)
    return out
"""


def write_site(site: Path) -> Path:
    """``FUSED_MOE_SITE`` at vLLM's module name under ``site`` (the packages above it made); returns ``site``."""
    parts = FUSED_MOE.split(".")
    for depth in range(1, len(parts)):
        pkg = site.joinpath(*parts[:depth])
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").touch()
    site.joinpath(*parts[:-1], parts[-1] + ".py").write_text(FUSED_MOE_SITE)
    return site


class DiffStandIn:
    """A differential-tier worker on a CPU: the build's stand-in ``fused_experts``, the tier's payload."""

    def __init__(self, reference: bool) -> None:
        from vllm.model_executor.layers.fused_moe import fused_moe  # the build's stand-in (its site): no vLLM here

        self.fm = fused_moe
        self.reference = reference
        self.bank = WeightBank(torch.device("cpu"), lambda w: w)
        self.fingerprints = Fingerprints()
        planted = sys.modules.get("moegate_planted")
        self.info: dict[str, Any] = {
            "vllm": "stand-in",
            "fp8": False,
            "env": {"torch": torch.__version__},
            "triton_cache": None,
            "python": platform.python_version(),
            "executable": sys.executable,
            "device": "cpu stand-in",
            "plant": None if planted is None else getattr(planted, "CONFIG", {}).get("spec"),
        }

    def run(self, case: MoECase, entrypoint: str, clock: StageClock | None) -> KernelResult:
        t, _, _ = self.bank.inputs(case)
        out = self.fm.fused_experts(
            t.hidden_states, t.w1, t.w2, t.topk_weights, t.topk_ids,
            apply_router_weight_on_input=case.apply_router_weight_on_input,
        )  # fmt: skip
        closeness = compare(out, reference_for(case, t), torch_dtype(case.dtype))
        path = expected_path(case, entrypoint).path.value
        result = KernelResult(case, entrypoint, path, out, closeness, None, t)
        result.payload = payload(result, self.fingerprints, self.reference)
        return result

    def sync(self) -> None:
        pass

    def memory(self) -> dict[str, int]:
        return {"peak_allocated": 0, "peak_reserved": 0, "weights_device": self.bank.device_bytes, "weights_pinned": 0}
