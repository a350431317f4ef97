"""How vLLM reads a pre-quantized checkpoint, asked of vLLM's own code without a GPU.

Three questions, each answered by the installed vLLM (its config classes, its layer-skip
matching, its expert weight-name mapping), never by a copy of its logic:

- ``read_quantization_config``: the config object vLLM builds from ``quantization_config``
  and what it says (method, block size, activation scheme, the weights' format);
- ``quantized_modules``: for each kind of module of a Qwen3-MoE layer, whether that config
  quantizes it or leaves it unquantized;
- ``expert_params``: the fused-MoE parameter each per-expert checkpoint tensor loads into.

Importing vLLM's quantization configs also imports its optional kernel packages; where one of
those is broken in an environment the import fails and ``TargetError`` says which.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from moegate.dispatch.names import TargetError

QWEN3_MOE_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
"""What Qwen3-MoE fuses at load time (vLLM checks each shard of a fused module against the ignore lists)."""

MODULES = {
    "attention": "model.layers.{layer}.self_attn.qkv_proj",
    "attention-out": "model.layers.{layer}.self_attn.o_proj",
    "router": "model.layers.{layer}.mlp.gate",
    "experts": "model.layers.{layer}.mlp.experts.0.gate_proj",  # how the CT MoE method names its layer's scheme
}


@dataclasses.dataclass(frozen=True)
class QuantReading:
    """What vLLM's config object says about a ``quantization_config``; plain data."""

    method: str
    config_class: str
    weight_block_size: list[int] | None = None
    activation_scheme: str | None = None
    serialized: bool | None = None  # fp8: the checkpoint holds fp8 weights (not online quantization)
    fmt: str | None = None  # compressed-tensors: the compression format
    weights: dict[str, Any] | None = None  # compressed-tensors: num_bits, type, strategy, group_size, symmetric
    inputs: dict[str, Any] | None = None  # compressed-tensors: the activations' quantization (None: 16-bit)
    moe_scheme: str | None = None  # compressed-tensors: which of vLLM's MoE predicates the scheme satisfies


def _config_class(method: str) -> Any:
    try:
        if method == "fp8":
            from vllm.model_executor.layers.quantization.fp8 import Fp8Config

            return Fp8Config
        if method == "compressed-tensors":
            from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
                CompressedTensorsConfig,
            )

            return CompressedTensorsConfig
    except Exception as exc:  # noqa: BLE001 - an optional kernel package of vLLM that does not import here
        raise TargetError(f"vLLM's {method} quantization config does not import here: {type(exc).__name__}: {exc}")
    raise TargetError(f"moegate reads quant_method fp8 and compressed-tensors, not {method!r}")


def _args(q: Any) -> dict[str, Any] | None:
    if q is None:
        return None
    return {k: getattr(q, k) for k in ("num_bits", "type", "strategy", "group_size", "symmetric", "dynamic")}


def _plain(v: Any) -> Any:
    return v.value if hasattr(v, "value") else v


def read_quantization_config(qc: dict[str, Any]) -> tuple[QuantReading, Any]:
    """(what vLLM's config object for ``qc`` says, the object itself)."""
    method = str(qc.get("quant_method"))
    cls = _config_class(method)
    config = cls.from_config(qc)
    config.packed_modules_mapping = dict(QWEN3_MOE_PACKED)
    if method == "fp8":
        reading = QuantReading(
            method=method,
            config_class=cls.__name__,
            weight_block_size=config.weight_block_size,
            activation_scheme=config.activation_scheme,
            serialized=config.is_checkpoint_fp8_serialized,
        )
        return reading, config
    scheme = config.target_scheme_map.get("Linear")
    if scheme is None:
        raise TargetError(f"vLLM reads no scheme for Linear modules from {qc.get('config_groups')}")
    w, a = scheme["weights"], scheme.get("input_activations")
    moe = None
    if config._is_wNa16_group_channel(w, a):
        moe = "wNa16"
    elif a is not None and config._is_dynamic_token_w8a8(w, a):
        moe = "w8a8-dynamic-token"
    reading = QuantReading(
        method=method,
        config_class=cls.__name__,
        fmt=scheme.get("format") or config.quant_format,
        weights={k: _plain(v) for k, v in (_args(w) or {}).items()},
        inputs=None if a is None else {k: _plain(v) for k, v in (_args(a) or {}).items()},
        moe_scheme=moe,
    )
    return reading, config


def quantized_modules(qc: dict[str, Any], layer: int = 0) -> dict[str, bool]:
    """For each of ``MODULES``: does vLLM quantize it under ``qc`` (False: left unquantized)?"""
    reading, config = read_quantization_config(qc)
    out = {}
    for kind, pattern in MODULES.items():
        prefix = pattern.format(layer=layer)
        if reading.method == "fp8":
            from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

            module = prefix.removesuffix(".0.gate_proj")  # the fused-MoE layer's own prefix
            skipped = is_layer_skipped(
                module,
                config.ignored_layers,
                config.packed_modules_mapping,
                match_mode=config.ignored_layers_match_mode,
            )
        else:
            from vllm.model_executor.layers.quantization.compressed_tensors.utils import should_ignore_layer

            skipped = should_ignore_layer(prefix, config.ignore, config.packed_modules_mapping)
        out[kind] = not skipped
    return out


EXPERT_TENSOR = re.compile(r"^(?P<layer>model\.layers\.\d+\.mlp)\.(?P<rest>experts\.\d+\.\w+\.\w+)$")


def expert_params(names: Iterable[str], experts: int) -> dict[str, tuple[str, int, str]]:
    """checkpoint name -> (fused-MoE parameter, expert id, shard) by vLLM's own mapping, for every expert tensor.

    ``RoutedExperts.build_expert_params_mapping`` lists (parameter prefix, checkpoint infix,
    expert, shard) for gate (w1), up (w3) and down (w2) projections; a checkpoint tensor
    ``...mlp.experts.E.gate_proj.SUFFIX`` loads into ``w13_SUFFIX``. Names no entry matches are left out.
    """
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    mapping = RoutedExperts.build_expert_params_mapping(
        "gate_proj", "down_proj", "up_proj", num_experts=experts, routed_experts_prefix=""
    )
    out = {}
    for name in names:
        m = EXPERT_TENSOR.match(name)
        if m is None:
            continue
        qual = m.group("rest")
        for param_prefix, infix, expert, shard in mapping:
            if qual.startswith(infix):
                param = param_prefix.removeprefix("experts.") + qual[len(infix) :]
                out[name] = (param, expert, shard)
                break
    return out
