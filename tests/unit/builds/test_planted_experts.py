"""The plants inside the fused-MoE experts (``moegate/builds/planted/plant_experts.py``), applied to stand-ins at vLLM's
module names in this process: what each changes and what it leaves alone. That a build carries them (copied beside
``plant.py``, imported at start-up) is shown by the differential tier's own test (``tests/unit/kernels/
test_diff_tier.py``); that they find their names in the real vLLM, by ``tests/dispatch/test_planted_experts.py``."""

from __future__ import annotations

import types

import pytest
import torch

from moegate.builds.planted import BuildError, parse_bug
from tests.support.diff_standin import FUSED_MOE, FUSED_MOE_SITE
from tests.support.plants import experts_plants

TRITON_MOE = "vllm.model_executor.layers.fused_moe.experts.triton_moe"
TRITON_SITE = """
class TritonExperts:
    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
              apply_router_weight_on_input):
        self.seen = (topk_weights.clone(), topk_ids.clone())
        output.copy_((hidden_states.float() * topk_weights.sum(1, keepdim=True)).to(output.dtype))


class TritonWNA16Experts(TritonExperts):
    def apply(self, output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
              expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
              apply_router_weight_on_input):  # its own apply, calling its parent's: the change must act once
        return super().apply(output, hidden_states, w1, w2, topk_weights, topk_ids, activation, global_num_experts,
                             expert_map, a1q_scale, a2_scale, workspace13, workspace2, expert_tokens_meta,
                             apply_router_weight_on_input)
"""


def _module(name: str, source: str, bug: str | None) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(source, module.__dict__)  # noqa: S102 - a stand-in's source
    if bug is not None:
        config = parse_bug(bug)
        said = experts_plants().patches(config)[config["kind"]][name](module)
        assert isinstance(said, str) and said
    return module


def _inputs(tokens: int = 6, top_k: int = 4) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, 64, generator=gen).to(torch.bfloat16)
    w1 = (torch.randn(8, 256, 64, generator=gen) / 8).to(torch.bfloat16)
    w2 = (torch.randn(8, 64, 128, generator=gen) / 11).to(torch.bfloat16)
    weights = torch.rand(tokens, top_k, generator=gen) + 0.05
    ids = torch.stack([torch.randperm(8, generator=gen)[:top_k] for _ in range(tokens)])
    return x, w1, w2, weights / weights.sum(1, keepdim=True), ids


def test_an_epilogue_rounding_adds_one_rounding_to_each_output_element_and_a_power_of_two_none():
    """The kernel runs on router weights 3 times too large, its output is divided by 3 and rounded once more."""
    x, w1, w2, weights, ids = _inputs()
    kernel = _module(FUSED_MOE, FUSED_MOE_SITE, None).fused_experts
    base = kernel(x, w1, w2, weights, ids)
    rounded = _module(FUSED_MOE, FUSED_MOE_SITE, "moe-reround=3").fused_experts(x, w1, w2, weights, ids)
    at_three = kernel(x, w1, w2, weights * 3, ids)
    assert rounded.dtype == torch.bfloat16 and torch.equal(rounded, (at_three.float() / 3).to(torch.bfloat16))
    assert not torch.equal(rounded, base)
    exact = _module(FUSED_MOE, FUSED_MOE_SITE, "moe-reround=2").fused_experts(x, w1, w2, weights, ids)
    assert torch.equal(exact, base)


def test_at_the_modular_entrypoint_the_weights_go_in_scaled_and_the_buffer_comes_back_divided_once():
    x, _, _, weights, ids = _inputs()
    for cls in ("TritonExperts", "TritonWNA16Experts"):
        module = _module(TRITON_MOE, TRITON_SITE, "moe-reround=3")
        experts = getattr(module, cls)()
        out = torch.zeros_like(x)
        experts.apply(out, x, None, None, weights, ids, "silu", 8, None, None, None, None, None, None, False)
        seen_weights, _ = experts.seen
        assert torch.allclose(seen_weights, weights * 3)  # once, though the subclass calls its parent
        inner = (x.float() * seen_weights.sum(1, keepdim=True)).to(torch.bfloat16)
        assert torch.equal(out, (inner.float() / 3).to(torch.bfloat16)), cls


def test_with_the_router_weight_on_the_input_the_output_is_multiplied_and_divided_instead():
    module = _module(FUSED_MOE, "def fused_experts(hidden_states, topk_weights, apply_router_weight_on_input=False):\n"
                     "    return hidden_states.clone()\n", "moe-reround=3")  # fmt: skip
    x = torch.randn(4, 32).to(torch.bfloat16)
    w = torch.ones(4, 1)
    out = module.fused_experts(x, w, apply_router_weight_on_input=True)
    assert torch.equal(out, ((x.float() * 3).to(torch.bfloat16).float() / 3).to(torch.bfloat16))


def test_a_reversed_topk_order_reverses_each_tokens_ids_and_weights_together():
    site = "def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids):\n    return topk_weights, topk_ids\n"
    x, w1, w2, weights, ids = _inputs()
    got_w, got_ids = _module(FUSED_MOE, site, "topk-order=reverse").fused_experts(x, w1, w2, weights, ids)
    assert torch.equal(got_w, weights.flip(1)) and torch.equal(got_ids, ids.flip(1))
    assert got_w.is_contiguous() and got_ids.is_contiguous()  # vLLM's kernel asserts a unit stride
    base = _module(FUSED_MOE, FUSED_MOE_SITE, None).fused_experts(x, w1, w2, weights, ids)
    summed = _module(FUSED_MOE, FUSED_MOE_SITE, "topk-order=reverse").fused_experts(x, w1, w2, weights, ids)
    assert not torch.equal(summed, base)  # the same experts added in another order, in bfloat16
    assert (summed.float() - base.float()).abs().max() <= base.float().abs().max() * 2**-6


def test_a_float32_activation_rounds_silu_and_mul_once_and_leaves_every_other_call_to_vllm():
    site = "CALLS = []\n\ndef apply_moe_activation(activation, output, input, **kw):\n    CALLS.append(activation)\n"
    module = _module(FUSED_MOE, site, "act-fp32=silu")
    h = torch.randn(5, 64).to(torch.bfloat16)
    out = torch.empty(5, 32, dtype=torch.bfloat16)
    module.apply_moe_activation("silu", out, h)
    g, u = h.float()[:, :32], h.float()[:, 32:]
    assert torch.equal(out, (torch.nn.functional.silu(g) * u).to(torch.bfloat16)) and module.CALLS == []
    clamped = types.SimpleNamespace(clamp_limit=7.0)
    module.apply_moe_activation("gelu", out, h)
    module.apply_moe_activation("silu", out, h, activation_config=clamped)
    module.apply_moe_activation("silu", out.float(), h.float())
    assert module.CALLS == ["gelu", "silu", "silu"]


@pytest.mark.parametrize(
    ("spec", "kind"),
    [("moe-reround=3", "moe-reround"), ("topk-order=reverse", "topk-order"), ("act-fp32=silu", "act-fp32")],
)
def test_the_experts_kinds_parse_and_a_wrong_value_is_refused(spec, kind):
    assert parse_bug(spec)["kind"] == kind
    wrong = {"moe-reround": "moe-reround=1", "topk-order": "topk-order=forward", "act-fp32": "act-fp32=gelu"}[kind]
    with pytest.raises(BuildError, match=wrong.split("=")[0]):
        parse_bug(wrong)
