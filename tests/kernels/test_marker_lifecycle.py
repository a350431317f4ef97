"""The UVA marker through vLLM's own offloader and loading context, and the next forward's path.

A small MoE layer (the two expert parameters vLLM's FusedMoE registers) is
offloaded by vLLM's ``UVAOffloader`` under a byte budget, then finalised the way
vLLM's loader finalises every layer: ``process_weights_after_loading`` inside
``device_loading_context``. The layer replaces its parameters there, which drops
the marker; the context must re-offload and re-mark them.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moegate.core.case import MoECase, Placement
from moegate.core.tensors import CaseTensors
from moegate.dispatch.names import UVA_MARKER
from moegate.kernels.check import reference_for
from moegate.kernels.tolerance import compare

CASE = MoECase(num_tokens=2, top_k=2, num_experts=64, hidden=256, intermediate=128)  # naive region for device weights


class TinyMoE(torch.nn.Module):
    """Expert weights as vLLM's FusedMoE holds them; ``replace`` picks how post-processing swaps them."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, order: tuple[str, str], replace: str, target) -> None:
        super().__init__()
        for name in order:
            self.register_parameter(
                name, torch.nn.Parameter((w13 if name == "w13_weight" else w2).clone(), requires_grad=False)
            )
        self.replace = replace
        self.target = target

    def process_weights_after_loading(self) -> None:
        for name in ("w13_weight", "w2_weight"):
            new = getattr(self, name).data.clone().contiguous()
            if self.replace == "new-parameter":  # a fresh Parameter object: the marker is gone
                setattr(self, name, torch.nn.Parameter(new, requires_grad=False))
            else:  # vLLM's replace_parameter, as quantization methods call it
                self.target.replace_parameter(self, name, new)


def marked(layer: torch.nn.Module) -> set[str]:
    return {n for n, p in layer.named_parameters() if getattr(p, UVA_MARKER, False)}


SCENARIOS = {
    # (registration order, budget in expert tensors, expected host-resident params)
    "both": (("w13_weight", "w2_weight"), "all", {"w13_weight", "w2_weight"}),
    "budget-w13-only": (("w13_weight", "w2_weight"), "first", {"w13_weight"}),
    "budget-w2-only": (("w2_weight", "w13_weight"), "first", {"w2_weight"}),
}


@pytest.mark.parametrize("replace", ["new-parameter", "replace_parameter"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("entrypoint", ["legacy", "modular"])
def test_marker_survives_post_processing_and_next_forward_is_sorted(
    cuda_target, bank, warm, scenario, replace, entrypoint
):
    order, budget, expected = SCENARIOS[scenario]
    t, _, _ = bank.inputs(CASE)
    layer = TinyMoE(t.w1, t.w2, order, replace, cuda_target).to(cuda_target.device)
    first = getattr(layer, order[0])
    max_bytes = first.numel() * first.element_size() if budget == "first" else 1 << 40
    offloaded = set(cuda_target.uva_offload(layer, max_bytes, {"w13_weight", "w2_weight"}))
    assert offloaded == expected, f"UVAOffloader with budget {max_bytes} B offloaded {offloaded}"

    cuda_target.process_weights_after_loading(layer)
    assert marked(layer) == expected, (
        f"after process_weights_after_loading under device_loading_context: {marked(layer)}"
    )

    placement = Placement(w13_host="w13_weight" in expected, w2_host="w2_weight" in expected)
    case = dataclasses.replace(CASE, placement=placement)
    obs = cuda_target.run_placed(case, entrypoint, t, layer.w13_weight, layer.w2_weight)
    ref = reference_for(case, CaseTensors(t.hidden_states, t.w1, t.w2, t.topk_weights, t.topk_ids, None))
    closeness = compare(obs.output, ref, torch.bfloat16)
    assert closeness.ok, f"post-processed weights give a wrong output: {closeness}"
    assert obs.path == "sorted", f"next forward took {obs.path} with {placement.label} weights after post-processing"
