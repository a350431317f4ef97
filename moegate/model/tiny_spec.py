"""The tiny Qwen3-MoE's shape: ``TinyMoESpec`` (layers, widths, experts, top-k, vocabulary), its named presets, and the build record a built directory carries (``BUILD_INFO``).

``moegate.model.tiny_model`` builds a checkpoint from a spec."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegate.core import hashing

BF16_BYTES = 2


BUILD_INFO = hashing.BUILD_INFO
"""Written beside the checkpoint: the spec it was built from, with library versions (``moegate.core.hashing`` keys a
model folder by it, so its name lives there)."""


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
