"""Pre-quantized tiny checkpoints written by moegate's own code, in formats vLLM loads as they are.

vLLM 0.33.0 cannot UVA-offload experts that it quantizes online (the offloader copies weights to
the host while online quantization still has them on the meta device), so a quantized MoE with
offloaded experts needs a checkpoint that is quantized already. ``quantize_checkpoint`` writes one
from a bf16 Qwen3-MoE checkpoint (``moegate.model.tiny_model``)::

    python -m moegate.model.quantize SRC DEST --scheme fp8-block [--overwrite]

Schemes (``SCHEMES``; the formats themselves: ``moegate.model.quant_formats``):

- ``fp8-block``: ``quant_method: fp8``, ``weight_block_size: [128, 128]``, dynamic activations,
  as the Qwen3-...-FP8 checkpoints are stored: every attention projection and every expert's
  ``gate_proj``/``up_proj``/``down_proj`` as float8_e4m3fn ``weight`` plus float32
  ``weight_scale_inv`` per 128 x 128 tile; ``lm_head`` and each layer's router (``mlp.gate``) stay
  bf16 and are listed in ``modules_to_not_convert``. vLLM serves its experts with ``Fp8MoEMethod``.
- ``w8a8-int8``: compressed-tensors ``int-quantized``: int8 ``weight`` with a float32
  ``weight_scale`` per output channel, int8 activations quantized per token at run time
  (``CompressedTensorsW8A8Int8MoEMethod``).
- ``w4a16``: compressed-tensors ``pack-quantized``: symmetric int4, group 128, ``weight_packed``
  (int32), bf16 ``weight_scale``, ``weight_shape`` (``CompressedTensorsWNA16MoEMethod``: Marlin or
  the wNa16 Triton experts, as ``moe_backend`` picks).

The compressed-tensors schemes quantize the experts only (``ignore`` lists ``lm_head``, the
attention projections and the routers): the MoE method is what they exist to exercise, and the
engine's start then does not depend on vLLM's linear kernels for those formats.

The e2e tier's block-FP8 model variant uses ``write_fp8_block(src, dest)``. Every writer is atomic:
built in a temporary folder beside ``DEST`` and renamed into place; bad input (not a Qwen3-MoE
checkpoint, already quantized, a shape the scheme cannot tile) is one ``ValueError`` line and
nothing is written. The source's build record (``moegate_tiny_model.json``) is carried over with a
``quantized`` entry and the new files' hashes, so the model's hash (the goldens' key) changes with
the weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from moegate.core.folders import replacing
from moegate.model import quant_formats as qf
from moegate.model.tiny_spec import BUILD_INFO

ARCHITECTURE = "Qwen3MoeForCausalLM"
MODEL_TYPE = "qwen3_moe"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
BLOCK = (128, 128)
GROUP = 128

EXPERT_WEIGHT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
ATTENTION_WEIGHT = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(q_proj|k_proj|v_proj|o_proj)\.weight$")
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class Scheme:
    """One checkpoint format: which weights it quantizes, the tensors it writes for each, its config."""

    name: str
    method: str  # the ``quant_method`` vLLM reads
    summary: str
    attention: bool  # quantize the attention projections too (else experts only)
    check: Callable[[tuple[int, ...], str], None]  # ValueError naming the tensor when its shape cannot be stored
    tensors: Callable[[torch.Tensor], dict[str, torch.Tensor]]  # suffix ("weight", "weight_scale", ...) -> tensor
    config: Callable[[int], dict[str, Any]]  # layers -> quantization_config


def _check_block(shape: tuple[int, ...], name: str) -> None:
    qf.check_divisible(shape, BLOCK, name)


def _check_group(shape: tuple[int, ...], name: str) -> None:
    if len(shape) != 2 or shape[1] % GROUP:
        raise ValueError(f"{name} has shape {list(shape)}: its {shape[-1]} input columns are not a multiple of {GROUP}")


def _check_any(shape: tuple[int, ...], name: str) -> None:
    if len(shape) != 2:
        raise ValueError(f"{name} has shape {list(shape)}, not a 2-D linear weight")


def _fp8_block_tensors(w: torch.Tensor) -> dict[str, torch.Tensor]:
    q, scale_inv = qf.fp8_block_quantize(w, BLOCK)
    return {"weight": q, "weight_scale_inv": scale_inv}


def _int8_tensors(w: torch.Tensor) -> dict[str, torch.Tensor]:
    q, scale = qf.int8_channel_quantize(w)
    return {"weight": q, "weight_scale": scale}


def _int4_tensors(w: torch.Tensor) -> dict[str, torch.Tensor]:
    q, scale = qf.int4_group_quantize(w, GROUP, torch.bfloat16)
    return {"weight_packed": qf.pack_int4(q), "weight_scale": scale, "weight_shape": torch.tensor(list(w.shape))}


def _routers(layers: int) -> list[str]:
    return [f"model.layers.{i}.mlp.gate" for i in range(layers)]


def _fp8_block_config(layers: int) -> dict[str, Any]:
    return {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": list(BLOCK),
        "modules_to_not_convert": ["lm_head", *_routers(layers)],
    }


CT_IGNORE = ["lm_head", "re:.*self_attn.*", r"re:.*mlp[.]gate$"]
"""What the compressed-tensors schemes leave bf16: vLLM matches ``re:`` entries from the name's start."""


def _ct_config(fmt: str, weights: dict[str, Any], inputs: dict[str, Any] | None) -> dict[str, Any]:
    base: dict[str, Any] = {
        "dynamic": False,
        "actorder": None,
        "block_structure": None,
        "observer": "minmax",
        "observer_kwargs": {},
    }
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {**base, **weights},
                "input_activations": None if inputs is None else {**base, "observer": None, **inputs},
                "output_activations": None,
            }
        },
        "ignore": list(CT_IGNORE),
        "kv_cache_scheme": None,
        "global_compression_ratio": None,
        "sparsity_config": {},
    }


def _int8_config(layers: int) -> dict[str, Any]:
    return _ct_config(
        "int-quantized",
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "group_size": None},
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True, "group_size": None},
    )


def _int4_config(layers: int) -> dict[str, Any]:
    return _ct_config(
        "pack-quantized",
        {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP},
        None,
    )


SCHEMES: dict[str, Scheme] = {
    s.name: s
    for s in (
        Scheme(
            "fp8-block",
            "fp8",
            "float8_e4m3fn weights, float32 scale_inv per 128x128 block, dynamic activations (Qwen3-FP8 layout)",
            True,
            _check_block,
            _fp8_block_tensors,
            _fp8_block_config,
        ),
        Scheme(
            "w8a8-int8",
            "compressed-tensors",
            "int8 weights with a float32 scale per output channel, int8 activations per token (experts only)",
            False,
            _check_any,
            _int8_tensors,
            _int8_config,
        ),
        Scheme(
            "w4a16",
            "compressed-tensors",
            "symmetric int4 weights packed eight to an int32, a bf16 scale per 128 inputs (experts only)",
            False,
            _check_group,
            _int4_tensors,
            _int4_config,
        ),
    )
}


# --- reading the source ---------------------------------------------------------------------


def read_config(src: Path) -> dict[str, Any]:
    """``src``'s config.json, or ``ValueError`` unless it is an unquantized Qwen3-MoE checkpoint."""
    path = src / "config.json"
    if not src.is_dir():
        raise ValueError(f"{src} is not a directory")
    if not path.is_file():
        raise ValueError(f"{src} is not a checkpoint: no config.json")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a JSON object")  # noqa: TRY004 - bad input: one line, exit 2
    if config.get("model_type") != MODEL_TYPE or ARCHITECTURE not in (config.get("architectures") or []):
        raise ValueError(
            f"{src} is not a Qwen3-MoE checkpoint (model_type {config.get('model_type')!r}, "
            f"architectures {config.get('architectures')!r}; want {MODEL_TYPE!r} / {ARCHITECTURE})"
        )
    if "quantization_config" in config:
        method = config["quantization_config"].get("quant_method", "?")
        raise ValueError(f"{src} is quantized already ({method}); start from the bf16 checkpoint")
    return config


def weight_files(src: Path) -> list[Path]:
    """The safetensors files holding ``src``'s weights (one file, or the shards its index names)."""
    index = src / WEIGHTS_INDEX
    if index.is_file():
        names = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
        files = [src / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if not names or missing:
            raise ValueError(f"{index} names shards that are not there: {missing or 'none listed'}")
        return files
    if (src / WEIGHTS).is_file():
        return [src / WEIGHTS]
    raise ValueError(f"{src} has no {WEIGHTS} (nor {WEIGHTS_INDEX})")


def read_weights(src: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in weight_files(src):
        tensors.update(load_file(str(f)))
    return tensors


def quantized_names(tensors: dict[str, torch.Tensor], config: dict[str, Any], scheme: Scheme) -> list[str]:
    """The weights ``scheme`` quantizes, in order; ``ValueError`` when one is missing or cannot be stored."""
    layers = int(config["num_hidden_layers"])
    experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
    experts_found: dict[int, set[tuple[int, str]]] = {i: set() for i in range(layers)}
    names = []
    for name in sorted(tensors):
        m = EXPERT_WEIGHT.match(name)
        if m:
            experts_found.setdefault(int(m.group(1)), set()).add((int(m.group(2)), m.group(3)))
        elif not (scheme.attention and ATTENTION_WEIGHT.match(name)):
            continue
        names.append(name)
    want = {(e, p) for e in range(experts) for p in ("gate_proj", "up_proj", "down_proj")}
    short = {layer: len(want - got) for layer, got in experts_found.items() if got != want}
    if not experts or short:
        raise ValueError(
            f"the checkpoint does not hold {experts} experts x gate/up/down for each of {layers} layers "
            f"(missing or extra in layers {sorted(short) or 'all'}): not a Qwen3-MoE checkpoint moegate can quantize"
        )
    for name in names:
        w = tensors[name]
        if w.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{name} is {w.dtype}, not a float weight")
        scheme.check(tuple(w.shape), name)
    return names


# --- writing --------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def quantize_tensors(tensors: dict[str, torch.Tensor], names: list[str], scheme: Scheme) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, the ``names`` replaced by the scheme's tensors (``prefix.suffix``)."""
    out: dict[str, torch.Tensor] = {}
    chosen = set(names)
    for name, w in tensors.items():
        if name not in chosen:
            out[name] = w.contiguous()
            continue
        prefix = name.removesuffix(".weight")
        for suffix, t in scheme.tensors(w).items():
            out[f"{prefix}.{suffix}"] = t.contiguous()
    return out


def _carry_record(src: Path, tmp: Path, record: dict[str, Any]) -> None:
    """The source's build record with a ``quantized`` entry and the new files' hashes (else nothing)."""
    info_path = src / BUILD_INFO
    if not info_path.is_file():
        return
    info = json.loads(info_path.read_text())
    info["quantized"] = record
    info["files"] = {f.name: _sha256(f) for f in sorted(tmp.iterdir()) if f.is_file() and f.name != BUILD_INFO}
    (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def quantize_checkpoint(
    src: str | os.PathLike[str], dest: str | os.PathLike[str], scheme: str, *, overwrite: bool = False
) -> Path:
    """Write ``src`` (a bf16 Qwen3-MoE checkpoint) quantized with ``scheme`` into ``dest``; return ``dest``.

    Atomic: ``dest`` appears whole or not at all; an existing ``dest`` is an error unless
    ``overwrite``. ``ValueError`` (one line) on bad input, before anything is written.
    """
    from safetensors.torch import save_file

    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    chosen = SCHEMES[scheme]
    src_dir, out = Path(src), Path(dest)
    config = read_config(src_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (or --overwrite) to replace it")
    if out.resolve() == src_dir.resolve():
        raise ValueError(f"{out} is the source checkpoint; write the quantized one elsewhere")
    tensors = read_weights(src_dir)
    names = quantized_names(tensors, config, chosen)
    quantized = quantize_tensors(tensors, names, chosen)

    layers = int(config["num_hidden_layers"])
    new_config = {**config, "quantization_config": chosen.config(layers)}
    skip = {"config.json", WEIGHTS, WEIGHTS_INDEX, BUILD_INFO} | {f.name for f in weight_files(src_dir)}
    with replacing(out) as tmp:
        for f in sorted(src_dir.iterdir()):
            if f.is_file() and f.name not in skip:
                shutil.copy2(f, tmp / f.name)
        save_file(quantized, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(new_config, indent=2, sort_keys=True) + "\n")
        record = {
            "scheme": chosen.name,
            "quant_method": chosen.method,
            "summary": chosen.summary,
            "quantized_weights": len(names),
            "source_weights_sha256": {f.name: _sha256(f) for f in weight_files(src_dir)},
        }
        _carry_record(src_dir, tmp, record)
    return out


def write_fp8_block(src: str | os.PathLike[str], dest: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """``src`` as a block-FP8 checkpoint (``[128, 128]`` blocks, the Qwen3-FP8 layout) in ``dest``.

    The e2e tier's FP8 model variant: ``write_fp8_block(tiny_model.build(...), dest)``. Needs
    hidden size, expert width and attention widths that are multiples of 128 (the default tiny
    shape is: hidden 256, expert width 128, 4 x 64 query and 2 x 64 key/value heads).
    """
    return quantize_checkpoint(src, dest, "fp8-block", overwrite=overwrite)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moegate.model.quantize", description=__doc__.splitlines()[0])
    parser.add_argument("src", help="a bf16 Qwen3-MoE checkpoint (python -m moegate.model.tiny_model)")
    parser.add_argument("dest", help="where the quantized checkpoint goes (made atomically)")
    parser.add_argument("--scheme", required=True, choices=sorted(SCHEMES))
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    try:
        path = quantize_checkpoint(args.src, args.dest, args.scheme, overwrite=args.overwrite)
    except (ValueError, FileExistsError, OSError) as exc:
        print(f"moegate.model.quantize: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
