"""What the census's configurations require the tiers to exercise: census features, and the items each maps to.

A *feature* is one thing the census (``golden/census/``) says vLLM serves through its Triton fused
MoE: the Triton experts themselves, an activation with the parameters its layers hand it, expert
biases, the router weight on the input, expert parallelism, a quantization scheme vLLM looks a tuned
config up for (with its block shape), the shapes' divisibility. ``features`` reads them from the
census records; each names the census lines it comes from.

An *item* is what the tiers must exercise for a feature (``ITEMS``), of three kinds:

- ``function`` ``FILE::QUALNAME`` (relative to the ``vllm`` folder): reached (a line of it ran). Every
  function the tiers reach is then held to its branches (``moegate.reach.report``): each taken, or
  its reason reviewed.
- ``specialisation`` ``KERNEL[FLAG=VALUE,...]``: some compiled variant of the Triton kernel had those
  compile-time values (``divisible:P`` / ``!divisible:P``: parameter ``P`` specialised as divisible by
  16, or not).
- ``condition`` ``NAME`` (``moegate.kernels.conditions.CONDITIONS``): some case made it matter.

``tier`` says which tier exercises an item: ``dispatch`` (the decision, on any machine) or
``kernels`` (a CUDA GPU). Nothing here imports vLLM or torch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from moegate.census.syntax import is_expr
from moegate.core.activation import PARAMETERS, Activation
from moegate.kernels.activations import conditions as activation_conditions
from moegate.kernels.conditions import INDEX_BOUNDARY
from moegate.kernels.reference import EXPERT_MAP, K_TAIL, ON_INPUT, W2_BIAS, W13_BIAS, ZERO_POINT
from moegate.reach.layout import PACKAGE

Kind = Literal["function", "specialisation", "condition"]
Tier = Literal["dispatch", "kernels"]

FM = f"{PACKAGE}/fused_moe.py"
TM = f"{PACKAGE}/experts/triton_moe.py"
ACT = f"{PACKAGE}/activation.py"
UTILS = f"{PACKAGE}/utils.py"
ALIGN = f"{PACKAGE}/moe_align_block_size.py"
KERNEL = f"{FM}::fused_moe_kernel"
WNA16_KERNEL = f"{FM}::fused_moe_kernel_gptq_awq"
FP8_GROUP_QUANT = "model_executor/layers/quantization/utils/fp8_utils.py::per_token_group_quant_fp8"
"""Block-wise fp8 activations: vLLM's CUDA op where it has one (on a CUDA GPU), its Triton kernel otherwise."""
SWIGLUSTEP = "model_executor/layers/activation.py::swiglustep_and_mul_triton"
SWIGLUSTEP_KERNEL = "model_executor/layers/activation.py::_swiglustep_and_mul_kernel"
DIVISIBLE = 16
"""Triton's ``tt.divisibility``: an integer argument divisible by 16 compiles to another variant."""


@dataclass(frozen=True)
class Feature:
    name: str
    source: str  # the census lines it comes from, in words


@dataclass(frozen=True)
class Item:
    kind: Kind
    key: str
    tier: Tier

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.key}"


def spec(kernel: str, **flags: Any) -> str:
    """The key of a specialisation item: ``KERNEL[FLAG=VALUE,...]`` (flags sorted)."""
    return f"{kernel}[{','.join(f'{k}={v}' for k, v in sorted(flags.items()))}]"


def _f(key: str, tier: Tier = "kernels") -> Item:
    return Item("function", key, tier)


def _s(kernel: str, **flags: Any) -> Item:
    return Item("specialisation", spec(kernel, **flags), "kernels")


def _c(name: str) -> Item:
    return Item("condition", name, "kernels")


TRITON: tuple[Item, ...] = (
    _f(f"{FM}::fused_experts", "dispatch"),
    _f(f"{FM}::fused_experts_impl", "dispatch"),
    _f(f"{FM}::_prepare_expert_assignment", "dispatch"),
    _f(f"{FM}::_weights_host_resident", "dispatch"),
    _f(f"{FM}::try_get_optimal_moe_config", "dispatch"),
    _f(f"{TM}::TritonExperts.apply", "dispatch"),
    _f(f"{FM}::dispatch_fused_moe_kernel"),
    _f(f"{FM}::invoke_fused_moe_triton_kernel"),
    _f(f"{ACT}::apply_moe_activation"),
    _f(f"{ALIGN}::moe_align_block_size"),
    _s(KERNEL, naive_block_assignment=True),
    _s(KERNEL, naive_block_assignment=False),
    _s(KERNEL, MUL_ROUTED_WEIGHT=True),
    _s(KERNEL, MUL_ROUTED_WEIGHT=False),
    _s(KERNEL, HAS_BIAS=False),
    _c(INDEX_BOUNDARY),
)
"""Every configuration the census lists runs these: the Triton experts at both entrypoints, both paths, any
prefill length (the 32-bit index boundary is a token count, not a model property)."""

QUANT: dict[str, tuple[Item, ...]] = {
    "fp8_w8a8": (_s(KERNEL, use_fp8_w8a8=True, group_k=0), _f(f"{UTILS}::moe_kernel_quantize_input")),
    "fp8_w8a8/128": (_s(KERNEL, use_fp8_w8a8=True, group_k=128), _f(FP8_GROUP_QUANT)),
    "fp8_w8a8/64": (_s(KERNEL, use_fp8_w8a8=True, group_k=64),),
    "fp8_w8a8/32": (_s(KERNEL, use_fp8_w8a8=True, group_k=32),),
    "int8_w8a16": (_s(KERNEL, use_int8_w8a16=True),),
    "int4_w4a16": (_s(WNA16_KERNEL, use_int4_w4a16=True), _c(ZERO_POINT)),
}
"""A tuned config's (dtype, block) vLLM's Triton lookup opens -> what serving it runs."""


def _activation_items(act: Activation) -> tuple[Item, ...]:
    items = tuple(_c(c) for c in activation_conditions(act))
    if act.name == "swiglustep":
        items += (_f(SWIGLUSTEP), _s(SWIGLUSTEP_KERNEL))
    return items


def _literal(layer: Mapping[str, Any], group: str, param: str) -> list[Any]:
    """What the census pins a layer argument to: its literal, else the values its config classes give."""
    given = layer[group].get(param)
    if given is not None and not is_expr(given):
        return [given]
    out: list[Any] = []
    for value in layer.get("values", {}).get(param, {}).values():
        out += value if isinstance(value, list) else [value]
    return out


def layer_activations(layer: Mapping[str, Any], accepted: Iterable[str]) -> list[Activation]:
    """The activations a layer can run, with the parameters its call hands them (placeholder values).

    An expression no config class pins may be any activation the Triton experts accept.
    """
    names = [n for n in _literal(layer, "activation", "activation") if isinstance(n, str)] or sorted(accepted)
    given = set(layer["activation"])
    out = []
    for name in names:
        required, optional = PARAMETERS.get(name, ((), ()))
        params: dict[str, float] = {}
        wants = {
            "limit": "swiglu_limit",
            "alpha": "swiglu_alpha",
            "beta": "swiglu_beta",
            "situ_beta": "activation_situ_beta",
            "situ_linear_beta": "activation_situ_linear_beta",
        }
        placeholder = {"limit": 7.0, "alpha": 1.702, "beta": 1.0, "situ_beta": 1.0, "situ_linear_beta": 2.0}
        for p in (*required, *optional):
            if p in required or wants[p] in given:
                params[p] = placeholder[p]
        out.append(Activation(name, **params))
    return out


def features(records: Sequence[Mapping[str, Any]]) -> dict[str, tuple[Feature, tuple[Item, ...]]]:
    """Every census feature with the items it requires, keyed by feature name."""
    layers = [r for r in records if r["kind"] == "layer"]
    accepted = [r["name"] for r in records if r["kind"] == "activation" and r.get("triton")]
    out: dict[str, tuple[Feature, tuple[Item, ...]]] = {}

    def add(name: str, source: str, items: tuple[Item, ...]) -> None:
        if name not in out:
            out[name] = (Feature(name, source), items)

    add("triton", f"{len(layers)} layers built by the fused-MoE layer builder", TRITON)
    for layer in layers:
        where = f"{layer['file']}::{layer['scope']}"
        for act in layer_activations(layer, accepted):
            add(f"activation {act.label}", where, _activation_items(act))
        bias = layer["bias"].get("has_bias")
        if bias is True or is_expr(bias):
            add("bias", where, (_s(KERNEL, HAS_BIAS=True), _c(W13_BIAS), _c(W2_BIAS)))
        on_input = layer["routing"].get("apply_router_weight_on_input")
        if on_input is True or is_expr(on_input):
            add("router weight on the input", where, (_c(ON_INPUT),))
        if layer.get("ep"):
            add("expert parallelism", where, (_c(EXPERT_MAP),))
    for tuned in records:
        if tuned["kind"] != "tuned" or not tuned.get("lookup") or tuned.get("dtype") is None:
            continue
        block = tuned.get("block_shape")
        name = tuned["dtype"] + (f"/{block[1]}" if block else "")
        if name in QUANT:
            add(f"quantization {name}", f"tuned config E={tuned.get('experts')} N={tuned.get('n')}", QUANT[name])
    for shape in records:
        if shape["kind"] != "shape":
            continue
        hidden, inter = shape.get("hidden"), shape.get("N")
        if not isinstance(hidden, int) or not isinstance(inter, int):
            continue
        where = f"{shape.get('config')} at TP{shape.get('tp')}: hidden {hidden}, N {inter}"
        for param, value in (("K", hidden), ("K", inter), ("N", hidden), ("N", 2 * inter)):
            div = value % DIVISIBLE == 0
            add(f"{param} {'' if div else 'not '}divisible by {DIVISIBLE}", where,
                (_s(KERNEL, **{f"{'' if div else '!'}divisible:{param}": True}),))  # fmt: skip
        if hidden % 128 or inter % 128:
            add("K not a multiple of the block", where, (_c(K_TAIL),))
    return out


def required(records: Sequence[Mapping[str, Any]]) -> dict[Item, list[str]]:
    """Every item some census feature requires -> the features requiring it."""
    out: dict[Item, list[str]] = {}
    for name, (_, items) in features(records).items():
        for item in items:
            out.setdefault(item, []).append(name)
    return out


def specialised(variant: Mapping[str, Any], key: str) -> bool:
    """Does a recorded variant (``Specialisation.to_dict``) satisfy the specialisation item ``key``?"""
    kernel, _, rest = key.partition("[")
    if variant["kernel"] != kernel:
        return False
    for pair in filter(None, rest.rstrip("]").split(",")):
        flag, _, want = pair.partition("=")
        if flag.startswith(("divisible:", "!divisible:")):
            param = flag.split(":", 1)[1]
            if (param in variant.get("divisible", [])) != (not flag.startswith("!")):
                return False
        elif str(variant.get("flags", {}).get(flag)) != want:
            return False
    return True
