"""The part of vLLM the reach report measures, found by its package layout: the fused-MoE package and the
activation and quantization helpers it calls.

Read as text (``ast``), never imported, from the vLLM this Python would import or a ``vllm`` folder given:

- ``PACKAGE``: every ``.py`` file of ``model_executor/layers/fused_moe``, every function in it;
- ``HELPERS``: the activation and quantization modules outside the package that it calls into. Of
  each, only the functions (and classes) the package names, and what those name in turn, are
  measured: a helper module's other functions serve other layers;
- ``KNOWN``: the modules the report's requirements name (``moegate.reach.requirements``): the
  Triton entrypoints, the activation, the alignment, the quantized-input helper.

A ``@triton.jit`` function is listed apart (``Layout.triton``): Python never runs its body, Triton
compiles it, so its behaviour is measured by the specialisations it was compiled for, not by
branches. A vLLM whose layout lacks a module listed here is refused with one line naming the
module and the file looked for (``LayoutError``): the report would otherwise measure less than
it says.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from moegate.census.source import CensusError, VllmSource, locate

PACKAGE = "model_executor/layers/fused_moe"
"""The fused-MoE package, relative to the ``vllm`` folder: measured whole."""

HELPERS = (
    "model_executor/layers/activation.py",
    "model_executor/layers/quantization/utils/fp8_utils.py",
    "model_executor/layers/quantization/utils/int8_utils.py",
    "model_executor/layers/quantization/utils/quant_utils.py",
    "model_executor/layers/quantization/utils/w8a8_utils.py",
    "_custom_ops.py",
)
"""Activation and quantization modules the package calls into: measured where the package names them."""

KNOWN = (
    f"{PACKAGE}/fused_moe.py",
    f"{PACKAGE}/experts/triton_moe.py",
    f"{PACKAGE}/activation.py",
    f"{PACKAGE}/utils.py",
    f"{PACKAGE}/config.py",
    f"{PACKAGE}/moe_align_block_size.py",
)
"""Modules of the package the report's requirements name by file."""

MODULE = "<module>"
"""The qualified name the report gives a file's module-level code."""


class LayoutError(RuntimeError):
    """The vLLM read lacks a module the report knows; the message is one line naming it."""


def module_name(rel: str) -> str:
    """``model_executor/layers/activation.py`` -> ``vllm.model_executor.layers.activation``."""
    return "vllm." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


@dataclass(frozen=True)
class Layout:
    """What one vLLM release's measured part is: its files, the helper scopes measured, its Triton kernels."""

    source: VllmSource
    files: tuple[str, ...]
    """Every measured file, relative to the ``vllm`` folder."""
    helper_scopes: dict[str, frozenset[str]] = field(default_factory=dict)
    """For each helper file, the qualified names measured in it (a class name covers its methods)."""
    triton: frozenset[str] = frozenset()
    """``file::qualname`` of every ``@triton.jit`` function in the measured files."""

    @property
    def version(self) -> str:
        return self.source.version

    def measures(self, rel: str, qualname: str) -> bool:
        """Is ``qualname`` of ``rel`` part of what the report measures?"""
        if rel not in self.files:
            return False
        scopes = self.helper_scopes.get(rel)
        if scopes is None or qualname == MODULE:
            return scopes is None
        return qualname.split(".")[0] in scopes or qualname in scopes


def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise LayoutError(f"reach: cannot read {path} ({exc})") from exc


def _names(nodes: Iterable[ast.AST]) -> set[str]:
    """Every identifier ``nodes`` use: names, attributes, the names ``from ... import`` brings in."""
    out: set[str] = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Name):
                out.add(node.id)
            elif isinstance(node, ast.Attribute):
                out.add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                out.update(a.name for a in node.names)
    return out


def _is_triton_jit(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        text = ast.unparse(target)
        if text.endswith(".jit") or text in ("jit", "triton_jit"):
            return True
    return False


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, def) of every function and method in ``tree``, nested ones as ``outer.inner``."""

    def walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = prefix + node.name
                yield name, node
                yield from walk(node.body, name + ".")
            elif isinstance(node, ast.ClassDef):
                yield from walk(node.body, prefix + node.name + ".")
            elif isinstance(node, ast.If | ast.Try | ast.With):  # defs under a platform check or a guard
                for part in ("body", "orelse", "finalbody"):
                    yield from walk(getattr(node, part, []), prefix)
                for handler in getattr(node, "handlers", []):
                    yield from walk(handler.body, prefix)

    yield from walk(tree.body, "")


def _top_level(tree: ast.Module) -> dict[str, ast.stmt]:
    """The module's top-level functions and classes by name (under an ``if`` too: platform-dependent defs)."""
    out: dict[str, ast.stmt] = {}
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.setdefault(node.name, node)
        elif isinstance(node, ast.If | ast.Try):
            stack.extend(node.body + node.orelse)
    return out


def _called(tree: ast.Module, used: set[str]) -> frozenset[str]:
    """The top-level functions and classes of a helper ``tree`` that ``used`` names, and what those name, closed."""
    defs = _top_level(tree)
    todo = [n for n in used if n in defs]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(n for n in _names([defs[name]]) if n in defs and n not in seen)
    return frozenset(seen)


def read(vllm_root: Path | None = None) -> Layout:
    """The measured part of the vLLM at ``vllm_root`` (default: the one this Python imports); ``LayoutError`` if not."""
    try:
        src = locate(vllm_root)
    except CensusError as exc:
        raise LayoutError(str(exc).replace("census:", "reach:", 1)) from exc
    package = src.root / PACKAGE
    if not (package / "__init__.py").is_file():
        raise LayoutError(
            f"reach: vLLM {src.version} at {src.root} has no module {module_name(PACKAGE + '/__init__.py')} "
            f"(looked for {package / '__init__.py'}); the reach report knows vLLM's fused-MoE layout of 0.32.0 and later"
        )
    missing = [rel for rel in (*KNOWN, *HELPERS) if not (src.root / rel).is_file()]
    if missing:
        rel = missing[0]
        more = (
            f" (and {len(missing) - 1} more: {', '.join(module_name(m) for m in missing[1:])})" if missing[1:] else ""
        )
        raise LayoutError(
            f"reach: vLLM {src.version} at {src.root} has no module {module_name(rel)} (looked for {src.root / rel})"
            f"{more}; the reach report does not know this layout: moegate/reach/layout.py lists what it measures"
        )
    package_files = sorted(src.rel(p) for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    trees = {rel: _parse(src.root / rel) for rel in package_files}
    used = _names(trees.values())
    helper_scopes = {}
    for rel in HELPERS:
        tree = _parse(src.root / rel)
        trees[rel] = tree
        helper_scopes[rel] = _called(tree, used)
    triton = frozenset(
        f"{rel}::{name}" for rel, tree in trees.items() for name, fn in functions(tree) if _is_triton_jit(fn)
    )
    return Layout(src, tuple(package_files) + HELPERS, helper_scopes, triton)


def matches(pattern: str, rel: str, qualname: str) -> bool:
    """``pattern`` (``FILE_GLOB`` or ``FILE_GLOB::QUALNAME_GLOB``, files relative to the ``vllm`` folder) matches?"""
    file_glob, _, scope_glob = pattern.partition("::")
    return fnmatch.fnmatchcase(rel, file_glob) and (not scope_glob or fnmatch.fnmatchcase(qualname, scope_glob))
