"""Give a random tiny model routers whose per-layer expert popularity over text is a measured one.

``moegate.model.text_routing`` measures, on a model that routes from text (the trained tiny
model over ShareGPT), each layer's inclusion frequency per expert: what decides how much a
decode step's tokens share experts. ``fit_routing`` makes a randomly initialised model (the
``wide`` preset: 128 experts, top-8) reproduce that curve, mapped onto its own experts and
layers, on the same kind of text:

- **A bias channel.** Hidden dimension ``CHANNEL`` of the residual stream carries the constant
  ``init_std * sqrt(hidden)`` for every token: the embedding holds it, and every weight that
  would read it (q/k/v, the experts' gate/up, the LM head) or write to it (o_proj, the experts'
  down projection) is zeroed there. So the routers are the only readers, and a router's column
  at ``CHANNEL`` adds ``r_e * s / rms(h)`` to expert ``e``'s logit, a per-expert bias (up to the
  token's RMS norm; Qwen3-MoE's router has no bias term, and vLLM would not load one).
- **The fit.** Layer by layer, in order (a layer's routing changes what the next one sees): a
  forward pass over the fit texts captures the router's input at decode positions, and the
  biases are found by a fixed-point iteration on those inputs, ``b_e += eta * sigma * (log q*_e -
  log q_e)``, until the top-k inclusion frequencies ``q`` match the mapped target ``q*``. The
  target's sorted curve is given to the experts in the order of their unbiased popularity, so
  the biases stay small.
- **The check** (measured, never assumed): after the fit, the model's own forward pass over the
  held-out texts (as many again, disjoint from the fit's) gives pairs per unique expert at 1, 2,
  3, 4 and 8 tokens a step, which must be within ``TOLERANCE`` (relative) of the source model's
  on the same held-out texts, at every level; otherwise the build fails. 5 % is several times the
  gap between the source's own fit and held-out curves (the sampling noise, in the target file)
  and a small fraction of the gap to the skewed wide model (``results/ab-text-routing.md``).

Everything is seeded and deterministic given the model, the target and the texts; the build
record keeps the recipe, the fitted biases' summary and the check (``fit_routing``'s return).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from moegate.model.text_routing import (
    LEVELS,
    TextSequence,
    batches,
    decode_topk,
    forward_batch,
    layer_map,
    map_popularity,
    measured_curve,
    popularity,
)

CHANNEL = 0
TOLERANCE = 0.05
ITERATIONS = 400


def greedy_continuations(model: Any, seqs: Sequence[TextSequence]) -> list[TextSequence]:
    """Each sequence with its continuation replaced by the model's own greedy tokens (as many), one text at a time."""
    import torch

    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for seq in seqs:
            n = len(seq.continuation)
            ids = torch.tensor([seq.prompt], device=device)
            gen = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)
            out.append(dataclasses.replace(seq, continuation=gen[0, len(seq.prompt) :].tolist()))
    return out


class _Captured(Exception):
    """Raised by the capture hook to end a forward pass at the router it reads."""


def router_inputs(model: Any, layer: int, seqs: Sequence[TextSequence]) -> Any:
    """Layer ``layer``'s router input at every decode position of ``seqs`` (tokens x hidden, float32, seqs' order)."""
    import torch

    gate = model.model.layers[layer].mlp.gate
    captured: list[Any] = []

    def hook(_module: Any, args: tuple[Any, ...]) -> None:
        captured.append(args[0].float().cpu())
        raise _Captured  # the layers after this one are not needed

    handle = gate.register_forward_pre_hook(hook)
    parts: dict[int, Any] = {}
    try:
        with torch.no_grad():
            for group in batches(seqs):
                captured.clear()
                width = max(len(seqs[i].tokens) for i in group)
                try:
                    forward_batch(model, seqs, group)
                except _Captured:
                    pass
                x = captured[0].reshape(len(group), width, -1)
                for row, i in enumerate(group):
                    parts[i] = x[row, len(seqs[i].prompt) : len(seqs[i].tokens)].clone()  # not a view of the batch
    finally:
        handle.remove()
    return torch.cat([parts[i] for i in range(len(seqs))])


def add_bias_channel(model: Any, spec: Any, channel: int = CHANNEL) -> float:
    """Make hidden dimension ``channel`` a constant the routers alone read; returns the constant."""
    import torch

    s = spec.init_std * spec.hidden**0.5
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p[:, channel] = s
            elif name.endswith("mlp.gate.weight"):
                p[:, channel] = 0.0  # the fitted biases go here
            elif name.endswith(("o_proj.weight", "experts.down_proj")) or (
                ".experts." in name and name.endswith("down_proj.weight")
            ):
                p.select(-2, channel).zero_()  # writes the residual stream: [..., hidden, in]
            elif p.dim() >= 2 and p.shape[-1] == spec.hidden:
                p[..., channel] = 0.0  # reads it: q/k/v, the experts' gate/up, the LM head
    return s


def inclusion(logits: Any, top_k: int) -> Any:
    """Each expert's share of the tokens whose top-k holds it."""
    import torch

    idx = logits.topk(top_k, dim=-1).indices.flatten()
    return torch.bincount(idx, minlength=logits.shape[-1]).float() / logits.shape[0]


def fit_bias(logits0: Any, a: Any, target: Any, top_k: int, iterations: int = ITERATIONS) -> tuple[Any, float]:
    """Router column ``r`` so that ``topk(logits0 + a r)``'s inclusion frequencies match ``target``; (r, max error).

    ``logits0`` (tokens x experts) are the router's logits without the channel, ``a`` (tokens)
    the channel's value in each token's router input. The best iterate (smallest largest
    absolute error) is returned.
    """
    import torch

    if abs(float(target.sum()) - top_k) > 1e-3:
        raise ValueError(f"target inclusion sums to {float(target.sum()):.4f}, not top_k={top_k}")
    n = logits0.shape[0]
    eps = 0.5 / n
    sigma = float(logits0.std(dim=0).mean())
    scale = float(a.mean())
    if not scale > 0:
        raise ValueError("the bias channel is not positive in the router input")
    log_target = torch.log(target + eps)
    beta = torch.zeros(logits0.shape[1])
    best, best_err = beta.clone(), math.inf
    for it in range(iterations):
        q = inclusion(logits0 + a[:, None] * (beta / scale)[None, :], top_k)
        err = float((q - target).abs().max())
        if err < best_err:
            best, best_err = beta.clone(), err
        beta += 0.5 * sigma * (0.995**it) * (log_target - torch.log(q + eps))
    return best / scale, best_err


def _check(measured: dict[str, float], source: dict[str, float], tolerance: float) -> dict[str, Any]:
    rel = {c: round(measured[c] / source[c] - 1, 4) for c in source}
    return {"relative_error": rel, "tolerance": tolerance, "ok": all(abs(r) <= tolerance for r in rel.values())}


def fit_routing(
    model: Any,
    spec: Any,
    target: dict[str, Any],
    fit: Sequence[TextSequence],
    held: Sequence[TextSequence],
    *,
    tolerance: float = TOLERANCE,
    source_held: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Fit every router of ``model`` (bf16, as served) to ``target``, then check it on ``held``; the build record.

    ``source_held`` is the source model's curve on the same held-out texts (default: the
    target's own held-out curve). Raises ``ValueError`` when the check fails.
    """
    import torch

    src = target["source"]
    s = add_bias_channel(model, spec)
    mapping = layer_map(src["layers"], spec.layers)
    layers = []
    for i, j in enumerate(mapping):
        want = torch.tensor(map_popularity(target["layers"][j]["popularity"], spec.experts, spec.top_k))
        x = router_inputs(model, i, fit)
        weight = model.model.layers[i].mlp.gate.weight
        logits0 = x @ weight.detach().float().cpu().T
        order = torch.argsort(inclusion(logits0, spec.top_k), descending=True, stable=True)
        assigned = torch.empty_like(want)
        assigned[order] = want
        r, err = fit_bias(logits0, x[:, CHANNEL], assigned, spec.top_k)
        with torch.no_grad():
            weight[:, CHANNEL] = r.to(weight.dtype).to(weight.device)
        a = x[:, CHANNEL]
        layers.append(
            {
                "source_layer": j,
                "fit_max_abs_error": round(err, 5),
                "channel_in_router_input": {"mean": round(float(a.mean()), 4), "std": round(float(a.std()), 4)},
                "bias_logits": {
                    "min": round(float((r * a.mean()).min()), 3),
                    "max": round(float((r * a.mean()).max()), 3),
                },
            }
        )
    table = decode_topk(model, held)
    curve = measured_curve(table)
    source = source_held or target["held_out_pairs_per_unique"]["overall"]
    check = _check(curve["overall"], {str(c): source[str(c)] for c in LEVELS}, tolerance)
    record = {
        "target_source": {k: src[k] for k in ("model", "model_hash", "experts", "top_k", "layers")},
        "target_text_sha256": target["text"]["sha256"],
        "layer_map": mapping,
        "channel": CHANNEL,
        "channel_value": s,
        "iterations": ITERATIONS,
        "fit_texts": len(fit),
        "held_out_texts": len(held),
        "layers": layers,
        "held_out_popularity_max_abs_error": [
            round(
                max(
                    abs(a - b)
                    for a, b in zip(
                        sorted(popularity(table[i], spec.experts), reverse=True),
                        map_popularity(target["layers"][j]["popularity"], spec.experts, spec.top_k),
                        strict=True,
                    )
                ),
                5,
            )
            for i, j in enumerate(mapping)
        ],
        "held_out_pairs_per_unique": curve,
        "source_held_out_pairs_per_unique": source,
        "check": check,
    }
    if not check["ok"]:
        worst = max(check["relative_error"].items(), key=lambda kv: abs(kv[1]))
        raise ValueError(
            f"text routing fit misses its target: pairs per unique expert at {worst[0]} tokens "
            f"{curve['overall'][worst[0]]:.3f} vs {source[worst[0]]:.3f} ({worst[1]:+.1%}, tolerance {tolerance:.0%})"
        )
    return record
