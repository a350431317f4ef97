"""A tiny model's checkpoint made and loaded: the seeded model before it is saved, a saved one and its tokenizer.

The bottom of ``moegate/model/`` beside ``tiny_spec``: the builder (``tiny_model``), the trainer
(``tiny_train``), the routing measurement and fit (``text_routing``, ``router_fit``) all make or load
a model through here. Needs torch and transformers (tokenizers for the tokenizer), imported where used:
the module itself imports with neither.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from moegate.model.tiny_spec import TinyMoESpec


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


def load_model(model_dir: Any, device: str | None = None) -> Any:
    """A built model in bf16 (as served), in eval mode, on ``device`` (default: CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).eval()
    if hasattr(model, "set_experts_implementation"):  # transformers 5: one grouped GEMM, not a loop over experts
        model.set_experts_implementation("grouped_mm")
    return model.to(device or "cpu")


def load_tokenizer(model_dir: Any) -> Callable[[str], list[int]]:
    """The model folder's tokenizer as ``text -> ids`` (no special tokens: vLLM's prompts carry none here)."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{model_dir} has no tokenizer.json: build it with --tokenizer-data")
    tok = Tokenizer.from_file(str(path))
    tok.no_truncation()
    return lambda text: tok.encode(text, add_special_tokens=False).ids
