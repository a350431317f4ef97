"""Offload truth on one layer: vLLM's ``UVAOffloader`` and loading context, judged by the CUDA driver, in a second.

The fast sibling of ``test_offload_truth.py`` (which starts engines): the two expert parameters vLLM's
FusedMoE registers, on a stand-in layer inside a decoder-layer path (``layers.0.mlp.experts``), offloaded
by vLLM's own ``UVAOffloader`` under a byte budget and a ``cpu_offload_params`` selection, then finalised
inside vLLM's ``device_loading_context`` with a post-processing that replaces the parameters (both ways
quantization methods do). ``moegate.offload.residency.observe`` asks the driver where every pointer points and
``moegate.offload.verdict.judge`` must PASS: the marked weights are host memory, the others device
memory, exactly the ones the budget admits. The power run's offload group uses this file to kill mutants of
the offloader and the loading context (``bash lab/gpu/offload_runs.sh power offload K/N``).
"""

from __future__ import annotations

import pytest
import torch

from moegate.core.case import MoECase
from moegate.dispatch.uva import uva_offload_layers
from moegate.offload.residency import calibrate_pinned, observe
from moegate.offload.verdict import Budget, judge

CASE = MoECase(num_tokens=2, top_k=2, num_experts=64, hidden=256, intermediate=128)
SELECT = {"experts": ("experts",), "w2-only": ("experts.w2_weight",), "w13-only": ("experts.w13_weight",)}


class Experts(torch.nn.Module):
    """The two expert parameters, as vLLM's FusedMoE registers them; ``replace`` is how post-processing swaps them."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, replace: str, target) -> None:
        super().__init__()
        self.w13_weight = torch.nn.Parameter(w13.clone(), requires_grad=False)
        self.w2_weight = torch.nn.Parameter(w2.clone(), requires_grad=False)
        self.replace, self.target = replace, target

    def process_weights_after_loading(self) -> None:
        for name in ("w13_weight", "w2_weight"):
            new = getattr(self, name).data.clone().contiguous()
            if self.replace == "new-parameter":
                setattr(self, name, torch.nn.Parameter(new, requires_grad=False))
            else:
                self.target.replace_parameter(self, name, new)


def model(w13: torch.Tensor, w2: torch.Tensor, replace: str, target, layers: int = 2) -> torch.nn.Module:
    """``layers.N.mlp.experts``: the names vLLM's selection and the observation see inside a decoder layer."""
    blocks = torch.nn.ModuleList()
    for _ in range(layers):
        block = torch.nn.Module()
        block.mlp = torch.nn.Module()
        block.mlp.experts = Experts(w13, w2, replace, target)
        blocks.append(block)
    root = torch.nn.Module()
    root.layers = blocks
    return root


@pytest.mark.parametrize("replace", ["new-parameter", "replace_parameter"])
@pytest.mark.parametrize("budget", ["all", "one-w13", "none"])
@pytest.mark.parametrize("select", list(SELECT))
def test_after_loading_every_weight_is_where_its_marker_and_the_budget_say(cuda_target, bank, select, budget, replace):
    t, _, _ = bank.inputs(CASE)
    root = model(t.w1, t.w2, replace, cuda_target).to(cuda_target.device)
    blocks = list(root.get_submodule("layers").children())
    w13_bytes = t.w1.numel() * t.w1.element_size()
    max_bytes = {"all": 1 << 40, "one-w13": w13_bytes, "none": 0}[budget]
    segments = SELECT[select]
    if max_bytes:  # one offloader, one budget, the decoder layers in order: as vLLM's loader wraps them
        moved = uva_offload_layers(blocks, max_bytes, set(segments))
        assert moved > 0
    for block in blocks:
        cuda_target.process_weights_after_loading(block.get_submodule("mlp.experts"))

    observation = observe(root, segments if max_bytes else ())
    verdict = judge(observation, Budget(max_bytes, segments), calibrate_pinned())
    assert verdict.passed, (
        f"select={select} budget={budget} replace={replace}: "
        + "; ".join(f.message for f in verdict.findings[:4])
        + f" (figures {verdict.figures})"
    )
    if budget == "all":
        assert verdict.figures["host_bytes"] == verdict.figures["selected_bytes"] > 0  # not vacuous
