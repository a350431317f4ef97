"""What the census's configurations require the tiers to exercise, read from the committed census."""

from __future__ import annotations

import functools
from typing import Any

from moegate.census import census
from moegate.core.activation import Activation
from moegate.kernels import activations
from moegate.kernels.reference import ON_INPUT, W13_BIAS
from moegate.reach import requirements as rq


@functools.cache
def records() -> list[dict[str, Any]]:
    return census.parse_golden(census.golden_path("0.33.0").read_text())


def test_the_census_features_carry_the_models_that_need_them():
    features = rq.features(records())
    assert {
        "triton",
        "bias",
        "router weight on the input",
        "expert parallelism",
        "K not a multiple of the block",
    } <= set(features)
    # gpt-oss: swigluoai with biases; Llama 4: the router weight on the input; fp8 128 x 128 and int4 tuned configs
    assert "activation swigluoai" in features and "quantization fp8_w8a8/128" in features
    assert "quantization int4_w4a16" in features
    # Nemotron-H's intermediate 7688 and Qwen2-MoE's odd splits: K not divisible by 16 at the second product
    assert "K not divisible by 16" in features and "N not divisible by 16" in features
    assert rq.Item("condition", ON_INPUT, "kernels") in features["router weight on the input"][1]
    assert rq.Item("condition", W13_BIAS, "kernels") in features["bias"][1]


def test_a_layer_with_a_clamp_limit_requires_its_clamps_and_one_without_does_not():
    layer = {"activation": {"activation": "silu", "swiglu_limit": "=self.limit"}, "values": {}}
    (act,) = rq.layer_activations(layer, ["silu"])
    assert act == Activation("silu", limit=7.0)
    assert {i.key for i in rq._activation_items(act)} == {activations.GATE_CLAMP, activations.UP_CLAMP}
    (plain,) = rq.layer_activations({"activation": {"activation": "silu"}, "values": {}}, ["silu"])
    assert rq._activation_items(plain) == ()


def test_an_unpinned_activation_may_be_any_the_triton_experts_accept():
    layer = {"activation": {"activation": "=config.hidden_act"}, "values": {}}
    assert {a.name for a in rq.layer_activations(layer, ["silu", "situ", "gelu"])} == {"silu", "situ", "gelu"}


def test_a_recorded_variant_satisfies_a_specialisation_by_its_flags_and_divisibility():
    variant = {"kernel": rq.KERNEL, "flags": {"HAS_BIAS": True, "group_k": 0}, "divisible": ["K"], "types": {}}
    assert rq.specialised(variant, rq.spec(rq.KERNEL, HAS_BIAS=True))
    assert rq.specialised(variant, rq.spec(rq.KERNEL, HAS_BIAS=True, group_k=0))
    assert not rq.specialised(variant, rq.spec(rq.KERNEL, HAS_BIAS=False))
    assert rq.specialised(variant, rq.spec(rq.KERNEL, **{"divisible:K": True}))
    assert not rq.specialised(variant, rq.spec(rq.KERNEL, **{"!divisible:K": True}))
    assert rq.specialised(variant, rq.spec(rq.KERNEL, **{"!divisible:N": True}))
    assert not rq.specialised(variant, rq.spec(rq.WNA16_KERNEL))
