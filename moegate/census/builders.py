"""The fused-MoE layer builders: what vLLM's model classes call to get a fused-MoE layer.

Found, not assumed: vLLM has called it ``FusedMoE`` (a class, with ``SharedFusedMoE``
deriving from it) and, in 0.32.0 and 0.33.0, ``FusedMoEFactory`` (a function that
returns the layer's runner). A builder is a function, or a class's ``__init__``, in
the fused-MoE layer module whose parameters include the four shape parameters
(``SHAPE_PARAMS``); a class deriving from a builder class, anywhere in vLLM, is one too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from moegate.census.source import CensusError, VllmSource
from moegate.census.syntax import parse, read, value

LAYER_MODULE = "model_executor/layers/fused_moe/layer.py"
"""Where vLLM defines its fused-MoE layer (relative to the vllm package)."""

SHAPE_PARAMS = ("num_experts", "top_k", "hidden_size", "intermediate_size")
"""The parameters every fused-MoE layer builder takes."""


@dataclass(frozen=True)
class Builder:
    """One builder: its name, the file defining it, and its parameters in order with their defaults."""

    name: str
    file: str
    params: tuple[str, ...]
    defaults: tuple[tuple[str, object], ...]  # (parameter, default as the census writes values)

    def default(self, param: str) -> object:
        return dict(self.defaults).get(param)

    def record(self) -> dict[str, object]:
        return {"kind": "builder", "name": self.name, "file": self.file, "defaults": dict(self.defaults)}


def _signature(fn: ast.FunctionDef) -> tuple[tuple[str, ...], tuple[tuple[str, object], ...]]:
    args = fn.args
    positional = [a.arg for a in args.posonlyargs + args.args]
    names = [n for n in positional if n not in ("self", "cls")] + [a.arg for a in args.kwonlyargs]
    defaults: list[tuple[str, object]] = []
    for name, d in zip(positional[len(positional) - len(args.defaults) :], args.defaults):
        defaults.append((name, value(d)))
    for a, kd in zip(args.kwonlyargs, args.kw_defaults):
        if kd is not None:
            defaults.append((a.arg, value(kd)))
    return tuple(names), tuple(defaults)


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            return node
    return None


def find_builders(src: VllmSource, files: Iterable[Path] = ()) -> list[Builder]:
    """The builders in ``LAYER_MODULE``, plus classes deriving from a builder class in ``files``."""
    path = src.path(LAYER_MODULE)
    if not path.is_file():
        raise CensusError(f"census: vLLM's fused-MoE layer module is missing: looked for {path}")
    found: list[Builder] = []
    classes: set[str] = set()
    for node in parse(path).body:
        if not isinstance(node, ast.FunctionDef | ast.ClassDef):
            continue
        fn = node if isinstance(node, ast.FunctionDef) else _init(node)
        if fn is None:
            continue
        params, defaults = _signature(fn)
        if all(p in params for p in SHAPE_PARAMS):
            found.append(Builder(node.name, LAYER_MODULE, params, defaults))
            if isinstance(node, ast.ClassDef):
                classes.add(node.name)
    if not found:
        raise CensusError(
            f"census: found no fused-MoE layer builder in {path}: looked for a function or class taking "
            f"{', '.join(SHAPE_PARAMS)} (vLLM 0.33.0 names it FusedMoEFactory)"
        )
    by_name = {b.name: b for b in found}
    for file in files:  # subclasses of a builder class build fused-MoE layers too
        if not classes or not any(c in read(file) for c in classes):
            continue
        for cls in ast.walk(parse(file)):
            if isinstance(cls, ast.ClassDef) and cls.name not in by_name:
                bases = {
                    b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                    for b in cls.bases
                }
                parent = next((by_name[b] for b in bases if b in classes), None)
                if parent is not None:
                    init = _init(cls)
                    params, defaults = _signature(init) if init is not None else (parent.params, parent.defaults)
                    derived = Builder(cls.name, src.rel(file), params, defaults)
                    found.append(derived)
                    by_name[cls.name] = derived
    return found
