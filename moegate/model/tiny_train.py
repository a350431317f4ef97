"""The trained tiny model: a small Qwen3-MoE trained on GSM8K's train split, and where its committed copy lives.

The random ``e2e`` model is the worst case for near-ties (every logit margin is tiny);
this one has a trained model's margins, GSM8K-shaped answers (``<<a*b=c>>c ... #### n``)
and routing that depends on the text. It is made by

    python -m moegate.model.tiny_model OUT --preset e2e-trained --tokenizer-data .../gsm8k/train.jsonl

which builds the seeded random checkpoint and the tokenizer as every preset does, then
trains the model on the same file with ``train_checkpoint`` and writes it back in bf16.
The recipe, the data's sha256, the loss curve (every step) and the run's device and
library versions go into the build record (``moegate_tiny_model.json``) beside every
file's sha256. It trains quickly on an H200 (``results/tiny-model-trained.md``) and would take hours on a
2-core CPU, so it was trained there once and committed (``models/e2e-trained/``, see
``trained_model_dir``); CI serves the committed file and checks it against its record.

Determinism: one seed draws the initial weights (``tiny_model.make_model``) and the order
of the packed rows; ``torch.use_deterministic_algorithms`` is on (``warn_only``: an op
without a deterministic kernel is named in the record's ``nondeterministic_ops`` instead of
stopping the run), TF32 is off, attention runs in transformers' eager implementation
(no fused attention backward with atomics). Whether a second run on the same machine gave
the same bits is measured, not assumed: see ``results/tiny-model-trained.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegate.core.hashing import sha256_file
from moegate.model.checkpoint import make_model
from moegate.model.tiny_spec import BUILD_INFO, TinyMoESpec
from moegate.model.tokenizer import _texts
from moegate.paths import MODELS_DIR

TRAINED_MODEL_ENV = "MOEGATE_E2E_TRAINED_MODEL"
"""Names another trained model directory for the e2e tier (default: the committed one)."""

COMMITTED_DIR = MODELS_DIR / "e2e-trained"
"""The committed checkpoint: weights, config, tokenizer and build record."""


@dataclass(frozen=True)
class TrainRecipe:
    """How the model is trained; every field is in the build record.

    The defaults are the run measured on the H200 on 2026-12-01 (``results/tiny-model-trained.md``):
    rows of 512 tokens packed from the whole split (about 1.24 M tokens at the 4,096-token
    vocabulary, so 400 steps of 64 rows are about 13 passes over it), AdamW with a linear
    warm-up and a cosine decay to a tenth, the router's load-balancing loss on so that every
    expert is used.
    """

    steps: int = 400
    batch: int = 64
    seq_len: int = 512
    lr: float = 3e-3
    warmup: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    router_aux_coef: float = 0.01
    seed: int = 0
    bf16_autocast: bool = True
    experts_implementation: str = "grouped_mm"
    attn_implementation: str = "eager"

    def __post_init__(self) -> None:
        problems = [
            f"{name}={getattr(self, name)} < 1" for name in ("steps", "batch", "seq_len") if getattr(self, name) < 1
        ]
        if not self.lr > 0:
            problems.append(f"lr={self.lr} must be > 0")
        if not 0 <= self.warmup < self.steps:
            problems.append(f"warmup={self.warmup} not in [0, steps={self.steps})")
        if not 0 <= self.min_lr_ratio <= 1:
            problems.append(f"min_lr_ratio={self.min_lr_ratio} not in [0, 1]")
        if problems:
            raise ValueError("invalid training recipe: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainRecipe:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown training field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    def lr_at(self, step: int) -> float:
        """Linear warm-up over ``warmup`` steps, then cosine from ``lr`` down to ``min_lr_ratio * lr``."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        done = (step - self.warmup) / max(1, self.steps - 1 - self.warmup)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done)))


RECIPES: dict[str, TrainRecipe] = {"e2e-trained": TrainRecipe()}
"""The trained presets of ``tiny_spec.PRESETS`` and how each is trained."""


def pack_rows(data: Path, tokenizer_json: Path, seq_len: int) -> tuple[Any, dict[str, Any]]:
    """Every record as the tokenizer saw it (``Question: ...\\nAnswer: ...\\n\\n``), in file order, packed into rows.

    One long token stream cut into ``[rows, seq_len]`` (the remainder dropped): a row
    often starts inside an answer and runs into the next ``Question:``, which is what a
    few-shot prompt looks like and where lm-eval's ``until`` stops a generation.
    """
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    texts = list(_texts(data))
    ids = [i for enc in tok.encode_batch(texts, add_special_tokens=False) for i in enc.ids]
    rows = len(ids) // seq_len
    if rows < 1:
        raise ValueError(f"{data} has {len(ids)} tokens, fewer than one row of {seq_len}")
    stream = torch.tensor(ids[: rows * seq_len], dtype=torch.long).view(rows, seq_len)
    return stream, {
        "file": data.name,
        "sha256": sha256_file(data),
        "documents": len(texts),
        "tokens": len(ids),
        "rows": rows,
        "text_format": "Question: {question}\\nAnswer: {answer}\\n\\n, packed, no special tokens",
    }


def _batches(rows: int, recipe: TrainRecipe) -> list[Any]:
    """Row indices of every step: seeded permutations, one per pass, taken in order (a pass's tail carries over)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(recipe.seed)
    pool = torch.empty(0, dtype=torch.long)
    out = []
    for _ in range(recipe.steps):
        while pool.numel() < recipe.batch:
            pool = torch.cat([pool, torch.randperm(rows, generator=gen)])
        out.append(pool[: recipe.batch])
        pool = pool[recipe.batch :]
    return out


def train_checkpoint(
    out: Path, spec: TinyMoESpec, recipe: TrainRecipe, data: Path, *, device: str | None = None
) -> dict[str, Any]:
    """Train the seeded model of ``spec`` on ``data`` and save it into ``out`` (bf16); return the record's part.

    ``out`` already holds the tokenizer (``tokenizer.json``); ``model.safetensors`` and
    ``config.json`` are written over. The caller's RNG and torch's determinism setting are
    left as they were.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic workspace
    import torch
    import torch.nn.functional as F
    import transformers

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows, data_info = pack_rows(data, out / "tokenizer.json", recipe.seq_len)
    batches = _batches(rows.shape[0], recipe)

    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    curve: dict[str, list[float]] = {"loss": [], "aux": [], "grad_norm": []}
    caught: list[warnings.WarningMessage] = []
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        model = make_model(spec)
        model.set_attn_implementation(recipe.attn_implementation)
        model.set_experts_implementation(recipe.experts_implementation)
        model.to(dev).train()
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=recipe.lr,
            betas=(recipe.beta1, recipe.beta2),
            eps=1e-8,
        )
        if dev.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step, idx in enumerate(batches):
                for group in opt.param_groups:
                    group["lr"] = recipe.lr_at(step)
                batch = rows[idx].to(dev)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=recipe.bf16_autocast):
                    res = model(input_ids=batch, output_router_logits=True, use_cache=False)
                logits = res.logits[:, :-1].float()
                ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
                aux = res.aux_loss.float()
                (ce + recipe.router_aux_coef * aux).backward()
                gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                curve["loss"].append(float(ce))
                curve["aux"].append(float(aux))
                curve["grad_norm"].append(float(gnorm))
        if dev.type == "cuda":
            torch.cuda.synchronize()
        train_s = time.perf_counter() - start
        experts_impl = model.config._experts_implementation
        attn_impl = model.config._attn_implementation
        model.set_experts_implementation("grouped_mm")  # the saved config names no training-only choice
        model.to("cpu").to(torch.bfloat16).eval()
        model.save_pretrained(out)
    finally:
        torch.use_deterministic_algorithms(was_deterministic, warn_only=was_warn_only)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32

    nondeterministic = sorted({str(w.message).splitlines()[0][:200] for w in caught if "determinis" in str(w.message)})
    return {
        "recipe": dataclasses.asdict(recipe),
        "data": data_info,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "experts_implementation": experts_impl,
        "attn_implementation": attn_impl,
        "deterministic_algorithms": True,
        "nondeterministic_ops": nondeterministic,
        "train_seconds": round(train_s, 2),
        "tokens_seen": recipe.steps * recipe.batch * recipe.seq_len,
        "loss_curve": curve,
    }


# --- the committed checkpoint ----------------------------------------------------------------


class TrainedModelError(RuntimeError):
    """The trained model directory is missing, or its files are not the ones its build record names."""


def check_record(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The build record of ``model_dir`` after checking every file it names against its sha256.

    A trained record (one with ``training``) is required: the random presets are built, not
    committed.
    """
    root = Path(model_dir)
    info = root / BUILD_INFO
    if not info.is_file():
        raise TrainedModelError(f"{root} has no build record ({BUILD_INFO})")
    record: dict[str, Any] = json.loads(info.read_text())
    if "training" not in record:
        raise TrainedModelError(f"{info} records no training: not a trained tiny model")
    files = record.get("files") or {}
    bad = []
    for name, digest in sorted(files.items()):
        path = root / name
        if not path.is_file():
            bad.append(f"{name} missing")
        elif sha256_file(path) != digest:
            bad.append(f"{name} sha256 {sha256_file(path)[:12]}, recorded {digest[:12]}")
    if bad or not files:
        raise TrainedModelError(f"{root} does not match its build record: {'; '.join(bad) or 'no files recorded'}")
    return record


def trained_model_dir(*, check: bool = True) -> Path:
    """The trained tiny model the e2e tier serves: ``$MOEGATE_E2E_TRAINED_MODEL``, else the committed one.

    With ``check`` its files are verified against the build record first (``check_record``),
    so a damaged or half-fetched checkpoint is one clear error before a server starts.
    """
    override = os.environ.get(TRAINED_MODEL_ENV)
    root = Path(override).expanduser() if override else COMMITTED_DIR
    if not root.is_dir():
        where = f"${TRAINED_MODEL_ENV}={override}" if override else "the committed copy"
        raise TrainedModelError(f"no trained tiny model at {root} ({where})")
    if check:
        check_record(root)
    return root


def compare_records(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """How two builds of one recipe differ: loss curves step by step, and which files' bytes differ.

    ``first_loss_difference`` is the first step whose loss is not bitwise equal (None: the
    whole curves are); ``max_loss_difference`` the largest absolute difference over the steps.
    """
    ca, cb = a["training"]["loss_curve"]["loss"], b["training"]["loss_curve"]["loss"]
    diffs = [abs(x - y) for x, y in zip(ca, cb, strict=False)]
    first = next((i for i, (x, y) in enumerate(zip(ca, cb, strict=False)) if x != y), None)
    files_a, files_b = a.get("files", {}), b.get("files", {})
    return {
        "same_recipe": a["training"]["recipe"] == b["training"]["recipe"],
        "steps": [len(ca), len(cb)],
        "loss_curves_identical": ca == cb,
        "first_loss_difference": first,
        "max_loss_difference": max(diffs, default=0.0),
        "final_loss": [ca[-1] if ca else None, cb[-1] if cb else None],
        "files_differing": sorted(k for k in set(files_a) | set(files_b) if files_a.get(k) != files_b.get(k)),
    }


def curve_table(record: dict[str, Any], every: int = 25) -> str:
    """The loss curve as a Markdown table, one row every ``every`` steps and the last step."""
    curve = record["training"]["loss_curve"]
    recipe = TrainRecipe.from_dict(record["training"]["recipe"])
    n = len(curve["loss"])
    steps = sorted({*range(0, n, every), n - 1})
    lines = ["| step | lr | loss (nats/token) | router aux | grad norm |", "| ---: | ---: | ---: | ---: | ---: |"]
    for i in steps:
        lines.append(
            f"| {i + 1} | {recipe.lr_at(i):.2e} | {curve['loss'][i]:.4f} | {curve['aux'][i]:.4f} "
            f"| {curve['grad_norm'][i]:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the trained model's directory after checking it (or another's, its curve, two runs' comparison)."""
    parser = argparse.ArgumentParser(prog="moegate train-tiny", description=main.__doc__)
    parser.add_argument("--check", metavar="DIR", default=None, help="check this directory instead")
    parser.add_argument("--curve", metavar="DIR", default=None, help="print DIR's loss curve (Markdown)")
    parser.add_argument("--every", type=int, default=25, help="the curve's row spacing in steps")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None, help="two builds of one recipe")
    args = parser.parse_args(argv)
    try:
        if args.compare:
            a, b = (json.loads((Path(d) / BUILD_INFO).read_text()) for d in args.compare)
            print(json.dumps(compare_records(a, b), indent=2))
        elif args.curve:
            print(curve_table(json.loads((Path(args.curve) / BUILD_INFO).read_text()), args.every))
        elif args.check:
            check_record(args.check)
            print(Path(args.check))
        else:
            print(trained_model_dir())
    except (TrainedModelError, OSError, KeyError, ValueError) as exc:
        print(f"moegate.model.tiny_train: {exc}", file=sys.stderr)
        return 2
    return 0
