"""Reading Python source as data: parsed modules, expression text, and calls with their scopes.

Expressions are recorded as ``ast.unparse`` text, so a reformatting of vLLM's
source (line breaks, quotes, parentheses) leaves the census unchanged and only a
change of meaning shows in its diff.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

EXPR = "="
"""Prefix of a value the census records as source text: ``"=config.hidden_act"`` is an expression, not a literal."""


@cache
def read(path: Path) -> str:
    """A source file's text (cached: several passes look through the same files)."""
    return path.read_text(encoding="utf-8", errors="replace")


@cache
def parse(path: Path) -> ast.Module:
    """The parsed module (cached)."""
    return ast.parse(read(path), filename=str(path))


def text(node: ast.AST) -> str:
    return ast.unparse(node)


NO_LITERAL = object()


def literal(node: ast.AST) -> Any:
    """The node's value when it is a literal (numbers, strings, None, tuples...), else ``NO_LITERAL``."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return NO_LITERAL


def value(node: ast.AST) -> Any:
    """A literal as itself, anything else as ``"=<source text>"``: the census's way of writing an argument."""
    v = literal(node)
    if v is NO_LITERAL:
        return EXPR + text(node)
    return list(v) if isinstance(v, tuple) else v


def is_expr(v: Any) -> bool:
    return isinstance(v, str) and v.startswith(EXPR)


def callee(call: ast.Call) -> str | None:
    """The called name: ``f`` for ``f(...)`` and ``a.b.f(...)``."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


@dataclass(frozen=True)
class ScopedCall:
    """A call, the dotted scope it sits in (``Class.method``), its enclosing class and the nodes above it."""

    call: ast.Call
    scope: str
    cls: str | None
    function: ast.FunctionDef | ast.AsyncFunctionDef | None
    parents: tuple[ast.AST, ...]  # outermost first, the call's own parent last


def scoped_calls(tree: ast.Module, names: frozenset[str]) -> Iterator[ScopedCall]:
    """Every call in ``tree`` whose callee is in ``names``, in source order, with its scope."""

    def walk(
        node: ast.AST,
        scope: tuple[str, ...],
        cls: str | None,
        fn: ast.FunctionDef | ast.AsyncFunctionDef | None,
        parents: tuple[ast.AST, ...],
    ) -> Iterator[ScopedCall]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call) and callee(child) in names:
                yield ScopedCall(child, ".".join(scope) or "<module>", cls, fn, parents + (node,))
            if isinstance(child, ast.ClassDef):
                yield from walk(child, scope + (child.name,), child.name, fn, parents + (node,))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield from walk(child, scope + (child.name,), cls, child, parents + (node,))
            else:
                yield from walk(child, scope, cls, fn, parents + (node,))

    yield from walk(tree, (), None, None, ())


def conditional(sc: ScopedCall) -> bool:
    """True when the call runs only on some paths through its function: under an if, a ternary, a loop or a handler."""
    inside = sc.parents
    if sc.function is not None and sc.function in inside:
        inside = inside[inside.index(sc.function) + 1 :]
    branching = (ast.If, ast.IfExp, ast.While, ast.For, ast.AsyncFor, ast.ExceptHandler, ast.Match, ast.BoolOp)
    return any(isinstance(p, branching) for p in inside)


def argument(call: ast.Call, name: str, position: int | None, params: tuple[str, ...] = ()) -> ast.AST | None:
    """The node passed for parameter ``name`` (by keyword, or at ``position``), or None when not passed."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if position is not None and position < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args):
        return call.args[position]
    return None


def imported_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> ``module.name`` for every ``from module import name [as local]`` (anywhere in the file)."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = ("." * node.level) + (node.module or "")
            for alias in node.names:
                out[alias.asname or alias.name] = f"{module}.{alias.name}"
    return out
