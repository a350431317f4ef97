"""vLLM's tuned fused-MoE configs, read from their file names, and the shapes they imply.

vLLM ships one JSON of Triton tile sizes per shape it was tuned for, named
``E=<experts>,N=<n>,device_name=<gpu>[,dtype=<d>][,block_shape=[a,b]][,backend=<b>].json``.
Its lookup (``try_get_optimal_moe_config``) takes ``E, _, N = w2.shape``: E is the
experts the rank holds (w2's rows: fused shared experts included, a 1/EP share under
expert parallelism) and N is the expert intermediate size of one tensor-parallel rank
(w2's last dimension; doubled back for int4, whose w2 packs two values a byte). So a
model with E0 routed experts, S fused shared experts and expert intermediate I served
at tensor parallelism TP and expert parallelism EP looks up ``E = E0/EP (+ S)``,
``N = I/TP``: each file name pins which (TP, EP) someone runs a model at.

``shapes`` joins the two: for every config class whose defaults pin a layer's
experts and intermediate size, the (TP, EP) degrees whose (E, N) vLLM has tuned
files for, with the hidden size and top-k that complete the shape (TP = EP = 1 is
always listed: the model's own shape).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from moegate.census.source import CensusError, VllmSource
from moegate.census.syntax import parse

CONFIGS_DIR = "model_executor/layers/fused_moe/configs"
DTYPE_NAMES = ("model_executor/layers/fused_moe/config.py", "_get_config_dtype_str")
"""Where vLLM names the dtype part of the file it looks up: the strings this function returns."""

_NAME = re.compile(
    r"^E=(?P<e>\d+),N=(?P<n>\d+),device_name=(?P<device>.+?)"
    r"(?:,dtype=(?P<dtype>[^,]+?))?(?:,block_shape=\[(?P<b0>\d+),(?P<b1>\d+)\])?(?:,backend=(?P<backend>[^,]+?))?\.json$"
)
DEGREES = (1, 2, 4, 8, 16, 32, 64)
"""Parallel degrees the shape join tries (powers of two, as deployments use)."""


def tuned_files(src: VllmSource) -> tuple[list[dict[str, Any]], list[str]]:
    """(one record per file, file names that do not parse); a missing or empty folder is a ``CensusError``."""
    folder = src.path(CONFIGS_DIR)
    if not folder.is_dir():
        raise CensusError(f"census: vLLM's tuned fused-MoE configs are missing: looked for the folder {folder}")
    records, unparsed = [], []
    for path in sorted(folder.glob("*.json")):
        m = _NAME.match(path.name)
        if m is None:
            unparsed.append(path.name)
            continue
        block = [int(m["b0"]), int(m["b1"])] if m["b0"] else None
        records.append(
            {
                "experts": int(m["e"]),
                "n": int(m["n"]),
                "device": m["device"],
                "dtype": m["dtype"],
                "block_shape": block,
                "backend": m["backend"],
            }
        )
    if not records:
        raise CensusError(
            f"census: no tuned fused-MoE config in {folder}: looked for files named "
            "E=<experts>,N=<n>,device_name=<gpu>[,dtype=...][,block_shape=[a,b]].json"
        )
    return records, unparsed


def looked_up_dtypes(src: VllmSource) -> set[str]:
    """The dtype names vLLM's Triton lookup can ask for (literal returns of ``_get_config_dtype_str``)."""
    rel, fn = DTYPE_NAMES
    path = src.path(rel)
    found: set[str] = set()
    if path.is_file():
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.FunctionDef) and node.name == fn:
                for sub in ast.walk(node):
                    value = (
                        sub.value.value if isinstance(sub, ast.Return) and isinstance(sub.value, ast.Constant) else None
                    )
                    if isinstance(value, str):
                        found.add(value)
    if not found:
        raise CensusError(f"census: cannot read which tuned configs vLLM looks up: looked for {fn} in {path}")
    return found


def grouped(records: Iterable[dict[str, Any]], dtypes: set[str]) -> list[dict[str, Any]]:
    """One census line per tuned (E, N, dtype, block shape, backend), with the GPUs it was tuned on.

    ``lookup``: whether vLLM's Triton fused MoE can ever open the file: its dtype is one
    the lookup names (``dtypes``) or none, it names no other backend, and a block shape
    comes with a quantized dtype (an unquantized call passes none).
    """
    devices: dict[tuple[Any, ...], list[str]] = defaultdict(list)
    for r in records:
        key = (r["experts"], r["n"], r["dtype"], tuple(r["block_shape"] or ()), r["backend"])
        devices[key].append(r["device"])
    out = []
    for (e, n, dtype, block, backend), devs in devices.items():
        rec: dict[str, Any] = {
            "kind": "tuned",
            "experts": e,
            "n": n,
            "dtype": dtype,
            "block_shape": list(block) or None,
        }
        if backend:
            rec["backend"] = backend
        rec["lookup"] = (dtype is None or dtype in dtypes) and not backend and (not block or dtype is not None)
        rec["devices"] = sorted(devs)
        out.append(rec)
    return out


def _label(r: dict[str, Any]) -> str:
    label = r["dtype"] or "unquantized"
    if r["block_shape"]:
        label += f",block_shape={r['block_shape']}"
    if r.get("backend"):
        label += f",backend={r['backend']}"
    return label


def _one(values: dict[str, Any], key: str, cls: str) -> int | None:
    v = values.get(key, {}).get(cls)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def shapes(layers: list[dict[str, Any]], tuned: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The shapes each pinned layer is served at (see the module docstring), one line per (config, TP, EP)."""
    by_en: dict[tuple[int, int], set[str]] = defaultdict(set)
    for r in tuned:
        if r["lookup"]:
            by_en[(r["experts"], r["n"])].add(_label(r))
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for layer in layers:
        values = layer["values"]
        fused = layer["shared"].get("n_shared_experts") not in (None, "=None")
        for cls in sorted({c for v in values.values() for c in v}):
            e0, inter = _one(values, "num_experts", cls), _one(values, "intermediate_size", cls)
            if e0 is None or inter is None:
                continue
            shared = (_one(values, "n_shared_experts", cls) or 0) if fused else 0
            hidden, top_k = _one(values, "hidden_size", cls), _one(values, "top_k", cls)
            for tp in DEGREES:
                for ep in (1,):
                    if inter % tp:
                        continue
                    e, n = e0 // ep + shared, inter // tp
                    labels = by_en.get((e, n), set())
                    if not labels and (tp, ep) != (1, 1):
                        continue
                    key = (cls, e0, shared, hidden, top_k, inter, tp, ep)
                    rec = found.setdefault(
                        key,
                        {
                            "kind": "shape",
                            "config": cls,
                            "experts": e0,
                            "shared": shared,
                            "hidden": hidden,
                            "top_k": top_k,
                            "intermediate": inter,
                            "tp": tp,
                            "ep": ep,
                            "E": e,
                            "N": n,
                            "tuned": sorted(labels),
                            "layers": [],
                        },
                    )
                    rec["layers"] = sorted({*rec["layers"], f"{layer['file']}::{layer['scope']}"})
    return list(found.values())
