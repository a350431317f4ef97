"""What vLLM's fused MoE accepts, independent of any model: its activations and its MoE quantization methods.

- Activations: the members of ``MoEActivation`` (name and value) and which of them
  ``apply_moe_activation`` runs, the set the Triton experts accept
  (``_APPLY_MOE_ACTIVATIONS``); a value ending in ``_no_mul`` is not gated (w13 holds
  N rows, not 2N).
- Quantization methods: every class deriving, directly or not, from
  ``FusedMoEMethodBase``: the schemes vLLM can serve a fused-MoE layer with, whatever
  model builds it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from moegate.census.source import CensusError, VllmSource
from moegate.census.syntax import parse, read

ACTIVATION_MODULE = "model_executor/layers/fused_moe/activation.py"
ACTIVATION_ENUM = "MoEActivation"
TRITON_ACTIVATIONS = "_APPLY_MOE_ACTIVATIONS"
METHOD_BASE = "FusedMoEMethodBase"


def activations(src: VllmSource) -> list[dict[str, Any]]:
    path = src.path(ACTIVATION_MODULE)
    if not path.is_file():
        raise CensusError(f"census: vLLM's fused-MoE activation module is missing: looked for {path}")
    tree = parse(path)
    members: dict[str, str] = {}
    accepted: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == ACTIVATION_ENUM:
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                ):
                    members[stmt.targets[0].id] = stmt.value.value
        value: ast.expr | None = None
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            value = node.value if node.targets[0].id == TRITON_ACTIVATIONS else None
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            value = node.value if node.target.id == TRITON_ACTIVATIONS else None
        for sub in ast.walk(value) if value is not None else ():
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == ACTIVATION_ENUM:
                accepted.add(sub.attr)
    if not members:
        raise CensusError(f"census: found no activation enum {ACTIVATION_ENUM} in {path}")
    return [
        {
            "kind": "activation",
            "name": v,
            "member": k,
            "gated": not v.endswith("_no_mul"),
            "triton": k in accepted,
        }
        for k, v in members.items()
    ]


_CLASS = re.compile(r"^[ \t]*class\s+(\w+)\s*\(([^)]*)\)\s*:", re.MULTILINE)


def quant_methods(src: VllmSource, files: list[Path]) -> list[dict[str, Any]]:
    """Classes deriving from ``FusedMoEMethodBase`` in ``files``, through any number of local bases.

    Class statements are read with a pattern rather than a parse: the quantization
    package is the largest part of vLLM the census reads, and a base list is a
    comma-separated list of (dotted) names.
    """
    classes: dict[str, tuple[str, set[str]]] = {}
    for file in files:
        text = read(file)
        if "MoEMethod" not in text:
            continue
        for name, bases_text in _CLASS.findall(text):
            bases = {b.strip().split(".")[-1].split("[")[0] for b in bases_text.split(",") if b.strip()}
            classes.setdefault(name, (src.rel(file), bases))
    derived: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for name, (rel, bases) in classes.items():
            if name not in derived and (METHOD_BASE in bases or bases & set(derived)):
                derived[name] = rel
                changed = True
    return [{"kind": "quant-method", "class": name, "file": rel} for name, rel in derived.items()]
