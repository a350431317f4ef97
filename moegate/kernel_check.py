"""One kernel-tier check: run a case through vLLM, compare with the torch reference.

Shared by the kernel tests and the kernel-tier benchmark so the figure the
benchmark reports is the cost of exactly what the tests assert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from moegate.case import MoECase
from moegate.kernel_inputs import WeightBank
from moegate.reference import Closeness, Reference, compare, compare_fp8, reference_moe
from moegate.tensors import CaseTensors, torch_dtype


@dataclass
class KernelResult:
    case: MoECase
    entrypoint: str
    path: str
    output: torch.Tensor
    closeness: Closeness

    def describe(self) -> str:
        return (
            f"{self.entrypoint} {self.case.short()} dtype={self.case.dtype} path={self.path}: {self.closeness}\n"
            f"  case: {self.case.to_json()}"
        )


def reference_for(case: MoECase, t: CaseTensors) -> Reference:
    return reference_moe(
        t.hidden_states,
        t.w1,
        t.w2,
        t.topk_weights,
        t.topk_ids,
        expert_map=t.expert_map,
        apply_router_weight_on_input=case.apply_router_weight_on_input,
        quant=case.quant,
        w1_scale=t.w1_scale,
        w2_scale=t.w2_scale,
    )


def run_checked(target: Any, bank: WeightBank, case: MoECase, entrypoint: str) -> KernelResult:
    """Run ``case`` with the bank's cached weights; the result says the path and the closeness."""
    t, w1, w2 = bank.inputs(case)
    obs = target.run_placed(case, entrypoint, t, w1, w2)
    if obs.output is None:
        raise AssertionError(f"{entrypoint} did not complete for {case.short()} (path {obs.path})")
    if case.quant is not None and not case.quant.weight_only:
        closeness = compare_fp8(
            obs.output,
            t.hidden_states,
            t.w1,
            t.w2,
            t.topk_weights,
            t.topk_ids,
            case.quant,
            t.w1_scale,
            t.w2_scale,
            obs.quantized,
            expert_map=t.expert_map,
            apply_router_weight_on_input=case.apply_router_weight_on_input,
        )
    else:
        closeness = compare(obs.output, reference_for(case, t), torch_dtype(case.dtype), case.quant)
    return KernelResult(case, entrypoint, obs.path, obs.output, closeness)
