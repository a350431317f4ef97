"""vLLM's own code reads moegate's pre-quantized checkpoints as the format they claim: config class, what is quantized, where each expert tensor loads.

On a CPU: vLLM's quantization config classes parse each written ``quantization_config``, its
layer-skip matching says the experts (and for block FP8 the attention) are quantized and the router
and ``lm_head`` are not, and its expert weight-name mapping sends every per-expert tensor to the
fused parameter the scheme's MoE method registers (names read from vLLM 0.33.0's ``create_weights``).
The packing of int4 values is checked against compressed-tensors' own unpacker (a vLLM dependency).
That the engine then loads and serves them is the GPU's job (``moegate offload-truth``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="building the tiny source checkpoint needs transformers")
pytest.importorskip("safetensors", reason="reading checkpoints needs safetensors")

import torch
from safetensors.torch import load_file

from moegate.dispatch.names import TargetError
from moegate.model.quantize import SCHEMES, quantize_checkpoint
from moegate.model.tiny_model import build

SHAPE: dict[str, Any] = {"layers": 1, "hidden": 128, "experts": 8, "top_k": 2, "moe_intermediate": 128, "heads": 2, "kv_heads": 2,
         "head_dim": 64, "vocab": 256}  # fmt: skip

EXPERT_PARAMS = {
    "fp8-block": {"w13_weight", "w2_weight", "w13_weight_scale_inv", "w2_weight_scale_inv"},
    "w8a8-int8": {"w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"},
    "w4a16": {"w13_weight_packed", "w2_weight_packed", "w13_weight_scale", "w2_weight_scale", "w13_weight_shape",
              "w2_weight_shape"},
}  # fmt: skip
"""The parameters each scheme's MoE method registers in vLLM 0.33.0 (Fp8MoEMethod, CompressedTensorsW8A8Int8MoEMethod,
CompressedTensorsWNA16MoEMethod ``create_weights``)."""


def _hide_broken_b12x() -> None:
    """Let vLLM see the optional ``b12x`` kernels as absent where their CUTLASS DSL does not import.

    vLLM's quantization configs import its linear kernels, which probe FlashInfer's optional b12x
    package; in the CPU env built from the CUDA wheel, b12x's CUTLASS DSL fails with an
    AttributeError against the installed cuda bindings, and vLLM's guard catches ImportError only.
    The configs themselves never use b12x; a module entry of None is how Python spells "absent".
    """
    if "b12x" in sys.modules:
        return
    try:
        import cutlass  # noqa: F401  (the CUTLASS DSL b12x is built on)
    except Exception:  # noqa: BLE001 - any failure here means b12x cannot work in this process either
        sys.modules["b12x"] = None  # type: ignore[assignment]


@pytest.fixture(scope="module")
def checkpoints(target, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``target`` for its skip (no vLLM here); the three schemes written from one tiny source."""
    _hide_broken_b12x()
    src = build(tmp_path_factory.mktemp("src") / "bf16", **SHAPE)
    out = tmp_path_factory.mktemp("quantized")
    return {name: quantize_checkpoint(src, out / name, name) for name in SCHEMES}


def reading(path: Path):
    from moegate.dispatch.checkpoints import read_quantization_config

    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    try:
        return read_quantization_config(qc)[0], qc
    except TargetError as exc:
        pytest.skip(str(exc))


def test_block_fp8_is_read_as_serialized_fp8_with_128_blocks_and_dynamic_activations(checkpoints):
    r, _ = reading(checkpoints["fp8-block"])
    assert (r.config_class, r.weight_block_size, r.activation_scheme, r.serialized) == (
        "Fp8Config",
        [128, 128],
        "dynamic",
        True,
    )


@pytest.mark.parametrize(
    "scheme, fmt, moe, bits, strategy, inputs",
    [("w8a8-int8", "int-quantized", "w8a8-dynamic-token", 8, "channel", "token"),
     ("w4a16", "pack-quantized", "wNa16", 4, "group", None)],
)  # fmt: skip
def test_compressed_tensors_schemes_select_the_moe_method_they_are_written_for(
    checkpoints, scheme, fmt, moe, bits, strategy, inputs
):
    r, _ = reading(checkpoints[scheme])
    assert (r.config_class, r.fmt, r.moe_scheme) == ("CompressedTensorsConfig", fmt, moe)
    assert (r.weights["num_bits"], r.weights["strategy"], r.weights["symmetric"]) == (bits, strategy, True)
    assert (r.inputs or {}).get("strategy") == inputs


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_vllm_quantizes_the_experts_and_leaves_the_router_unquantized(checkpoints, scheme):
    from moegate.dispatch.checkpoints import quantized_modules

    _, qc = reading(checkpoints[scheme])
    attention = scheme == "fp8-block"
    assert quantized_modules(qc) == {
        "attention": attention,
        "attention-out": attention,
        "router": False,
        "experts": True,
    }


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_every_expert_tensor_loads_into_a_parameter_the_moe_method_registers(checkpoints, scheme):
    from moegate.dispatch.checkpoints import expert_params

    names = list(load_file(str(checkpoints[scheme] / "model.safetensors")))
    experts = [n for n in names if ".mlp.experts." in n]
    mapped = expert_params(names, SHAPE["experts"])
    assert sorted(mapped) == sorted(experts), "an expert tensor vLLM's mapping does not place"
    assert {p for p, _, _ in mapped.values()} == EXPERT_PARAMS[scheme]
    for name, (param, expert, shard) in mapped.items():
        assert f".experts.{expert}." in name
        assert shard == {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[name.split(".")[-2]], name
        assert param.startswith("w2_" if shard == "w2" else "w13_"), (name, param)


def test_int4_packing_is_what_compressed_tensors_unpacks(checkpoints):
    """The w4a16 writer's bit layout, read back by compressed-tensors' own unpacker."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    from moegate.model import quant_formats as qf

    t = load_file(str(checkpoints["w4a16"] / "model.safetensors"))
    prefix = "model.layers.0.mlp.experts.3.down_proj"
    packed, shape = t[prefix + ".weight_packed"], torch.Size(t[prefix + ".weight_shape"].tolist())
    assert torch.equal(unpack_from_int32(packed, 4, shape), qf.unpack_int4(packed))
