"""The tiny Qwen3-MoE builder: deterministic, the requested shape, loadable, atomic, clear on bad input."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TypedDict

import pytest

pytest.importorskip("transformers", reason="the tiny-model builder needs transformers")

from moegate.core.hashing import model_hash
from moegate.model import tiny_model, tiny_spec
from moegate.model.tiny_model import build
from moegate.model.tiny_spec import BUILD_INFO, TinyMoESpec
from tests.support import ROOT


class Shape(TypedDict, total=False):
    """Overrides of ``TinyMoESpec``'s shape fields, as ``build`` takes them (its other keywords are not ints)."""

    layers: int
    hidden: int
    experts: int
    top_k: int
    moe_intermediate: int
    vocab: int


SMALL: Shape = {"layers": 2, "hidden": 128, "experts": 16, "top_k": 2, "moe_intermediate": 64, "vocab": 256}
"""A faster shape for the properties that do not depend on the default one."""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def default_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("tiny") / "model")


def test_same_seed_gives_byte_identical_weights_and_another_seed_does_not(tmp_path):
    a = build(tmp_path / "a", **SMALL)
    b = build(tmp_path / "b", **SMALL)
    c = build(tmp_path / "c", **SMALL, seed=1)
    assert sha256(a / "model.safetensors") == sha256(b / "model.safetensors")
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()
    assert sha256(a / "model.safetensors") != sha256(c / "model.safetensors")


def test_building_leaves_the_callers_rng_alone(tmp_path):
    import torch

    before = torch.get_rng_state()
    build(tmp_path / "m", **SMALL)
    assert torch.equal(before, torch.get_rng_state())


def test_config_has_the_requested_shape(default_model):
    spec = TinyMoESpec()
    cfg = json.loads((default_model / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert cfg["num_hidden_layers"] == spec.layers == 2
    assert cfg["hidden_size"] == spec.hidden == 256
    assert cfg.get("num_experts", cfg.get("num_local_experts")) == spec.experts == 128
    assert cfg["num_experts_per_tok"] == spec.top_k == 8
    assert cfg["moe_intermediate_size"] == spec.moe_intermediate
    assert cfg["head_dim"] == 64 and cfg["num_attention_heads"] == 4 and cfg["num_key_value_heads"] == 2
    assert cfg["norm_topk_prob"] is True and cfg["decoder_sparse_step"] == 1 and cfg["mlp_only_layers"] == []
    assert cfg["dtype"] == "bfloat16" and cfg["vocab_size"] == 512 and cfg["max_position_embeddings"] == 512
    assert TinyMoESpec.from_model_dir(default_model) == spec
    assert (default_model / BUILD_INFO).is_file()


def test_spec_is_read_back_from_the_config_alone(default_model, tmp_path):
    """A checkpoint without moegate's build record (built elsewhere) still gives its shape."""
    shutil.copy(default_model / "config.json", tmp_path / "config.json")
    assert TinyMoESpec.from_model_dir(tmp_path) == TinyMoESpec()
    with pytest.raises(ValueError, match="not a model directory"):
        TinyMoESpec.from_model_dir(tmp_path / "nowhere")


def test_expert_bytes_in_the_checkpoint_match_the_spec(default_model):
    import torch
    from safetensors import safe_open

    spec = TinyMoESpec()
    per_layer: dict[int, dict[str, int]] = {}
    with safe_open(str(default_model / "model.safetensors"), "pt") as f:
        for key in f.keys():  # noqa: SIM118 - a safetensors handle, not a dict
            if ".mlp.experts." not in key:
                continue
            layer = int(key.split(".layers.")[1].split(".")[0])
            t = f.get_tensor(key)
            assert t.dtype == torch.bfloat16, f"{key} is {t.dtype}"
            kind = "w2" if "down_proj" in key else "w13"
            per_layer.setdefault(layer, {"w13": 0, "w2": 0})[kind] += t.numel() * t.element_size()
    assert per_layer == {i: {"w13": spec.w13_bytes, "w2": spec.w2_bytes} for i in range(spec.layers)}
    assert spec.w13_bytes == 128 * 2 * 128 * 256 * 2 == 16 * 2**20  # one layer's w13: 1/64 GiB exactly


def test_checkpoint_loads_back_with_transformers(default_model):
    import torch
    from transformers import Qwen3MoeForCausalLM

    model = Qwen3MoeForCausalLM.from_pretrained(default_model, dtype=torch.bfloat16)
    assert model.config.num_experts == 128 and model.config.num_experts_per_tok == 8
    with torch.no_grad():
        logits = model(torch.tensor([[5, 9, 200, 31]])).logits
    assert logits.shape == (1, 4, 512) and torch.isfinite(logits).all()


def test_bad_shape_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match=r"top_k=9 not in \[1, experts=8\]"):
        build(tmp_path / "m", experts=8, top_k=9)
    with pytest.raises(ValueError, match=r"heads=4 not a multiple of kv_heads=3"):
        build(tmp_path / "m", kv_heads=3)
    with pytest.raises(ValueError, match=r"unknown tiny-model field\(s\) \['expertz'\]"):
        build(tmp_path / "m", expertz=8)
    assert list(tmp_path.iterdir()) == []


def test_existing_directory_needs_overwrite_and_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    out = build(tmp_path / "m", **SMALL)
    first = sha256(out / "model.safetensors")
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        build(out, **SMALL)

    def boom(path: Path, spec: TinyMoESpec, *rest: object) -> None:
        (path / "partial").write_text("half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny_model, "_write", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        build(out, overwrite=True, **SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"], "a failed build left a temporary directory"
    assert sha256(out / "model.safetensors") == first, "a failed overwrite damaged the existing checkpoint"


def test_command_line_bad_input_is_one_line_and_nonzero(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "moegate.model.tiny_model", str(tmp_path / "m"), "--top-k", "200"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "moegate.model.tiny_model: invalid tiny model: top_k=200 not in [1, experts=128]"
    ]
    assert not (tmp_path / "m").exists()


def _gsm8k_train() -> Path:
    from moegate.e2e.gsm8k_files import DataError, gsm8k_file

    try:
        return gsm8k_file("train.jsonl")
    except DataError as exc:
        pytest.skip(f"GSM8K is not beside the checkout: {exc}")


def test_a_build_with_its_tokenizer_is_reproducible_and_records_every_file(tmp_path):
    train = _gsm8k_train()
    shape: Shape = {**SMALL, "vocab": 512}
    a = build(tmp_path / "a", tokenizer_data=train, **shape)
    b = build(tmp_path / "b", tokenizer_data=train, **shape)
    record = json.loads((a / BUILD_INFO).read_text())
    assert set(record["files"]) >= {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"}
    assert record["files"]["tokenizer.json"] == sha256(a / "tokenizer.json") and record["tokenizer"]["vocab"] == 512
    assert model_hash(a) == model_hash(b)
    assert model_hash(a) != model_hash(build(tmp_path / "c", **shape))


def test_router_skew_moves_only_the_embeddings_and_the_routers(tmp_path):
    from safetensors.torch import load_file

    plain = load_file(str(build(tmp_path / "p", **SMALL) / "model.safetensors"))
    skewed = load_file(str(build(tmp_path / "s", hot_experts=4, router_skew=3.0, **SMALL) / "model.safetensors"))
    moved = {k for k in plain if not plain[k].equal(skewed[k])}
    assert moved and all(k.endswith(("embed_tokens.weight", "mlp.gate.weight")) for k in moved)
    gate = next(k for k in moved if k.endswith("mlp.gate.weight"))
    rows = (plain[gate].float() - skewed[gate].float()).abs().sum(-1) > 0
    assert int(rows.sum()) == 4  # exactly the hot experts' router rows


def test_presets_and_bad_skew_are_checked(tmp_path):
    with pytest.raises(ValueError, match="unknown preset"):
        build(tmp_path / "x", preset="huge")
    with pytest.raises(ValueError, match="router_skew"):
        TinyMoESpec(hot_experts=1, router_skew=1.0)  # fewer hot experts than top_k
    assert TinyMoESpec.from_dict(tiny_spec.PRESETS["wide"]).w13_bytes == 128 * 2 * 768 * 2048 * 2
