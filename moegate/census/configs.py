"""Model-config class defaults: the values a model's ``config.X`` takes when its checkpoint does not say.

A fused-MoE layer is built from its model's config (``num_experts=config.num_experts``).
Where that config class ships with vLLM (``vllm/transformers_utils/configs``) or with
the transformers release installed beside it, its defaults are the shape of the
model the class is named after (``Qwen3MoeConfig``: 128 experts, hidden 2048,
expert intermediate 768, top-8). Both are read as text: class-level defaults
(transformers 5 declares them as annotated class attributes), ``__init__`` keyword
defaults, ``attribute_map`` aliases, and the same for base classes found here.

``Resolver`` turns an argument's expression into those values: ``config.X``,
``getattr(config, "X", d)``, ``config.X[i]``, and one or two steps back through
``self.x = ...`` or a local ``x = ...`` in the same class or function.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from moegate.census.source import VllmSource
from moegate.census.syntax import NO_LITERAL, ScopedCall, imported_names, literal, parse

VLLM_CONFIGS = "transformers_utils/configs"
GENERIC = frozenset({"PretrainedConfig", "PreTrainedConfig", "object"})


@dataclass
class ConfigClass:
    name: str
    file: Path
    defaults: dict[str, object] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    bases: tuple[str, ...] = ()


def _class_defaults(node: ast.ClassDef, file: Path) -> ConfigClass:
    cls = ConfigClass(node.name, file, bases=tuple(b.id for b in node.bases if isinstance(b, ast.Name)))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            v = literal(stmt.value)
            if v is not NO_LITERAL:
                cls.defaults[stmt.target.id] = v
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            name = stmt.targets[0].id
            v = literal(stmt.value)
            if name == "attribute_map" and isinstance(v, dict):
                cls.aliases.update({str(k): str(x) for k, x in v.items()})
            elif v is not NO_LITERAL and not name.startswith("_"):
                cls.defaults.setdefault(name, v)
        elif isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            args = stmt.args
            pos = args.posonlyargs + args.args
            for a, d in list(zip(pos[len(pos) - len(args.defaults) :], args.defaults)) + [
                (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None
            ]:
                v = literal(d)
                if v is not NO_LITERAL:
                    cls.defaults.setdefault(a.arg, v)
    cls.defaults = {k: v for k, v in cls.defaults.items() if _plain(v)}
    return cls


def _plain(v: object) -> bool:
    return (
        v is None
        or isinstance(v, bool | int | float | str)
        or (isinstance(v, list | tuple) and all(isinstance(x, bool | int | float | str) for x in v))
    )


class ConfigIndex:
    """Config classes by name, from vLLM's own configs and the transformers installed beside vLLM."""

    def __init__(self, src: VllmSource) -> None:
        self.src = src
        self._cache: dict[str, ConfigClass | None] = {}

    @cached_property
    def _files(self) -> list[tuple[Path, str]]:
        roots = [self.src.path(VLLM_CONFIGS)]
        tf = self.src.site / "transformers" / "models"
        files = [p for r in roots if r.is_dir() for p in sorted(r.rglob("*.py"))]
        if tf.is_dir():
            files += sorted(tf.glob("*/configuration_*.py"))
        return [(p, p.read_text(encoding="utf-8", errors="replace")) for p in files]

    @cached_property
    def transformers_version(self) -> str | None:
        for info in sorted(self.src.site.glob("transformers-*.dist-info")):
            return info.name[len("transformers-") : -len(".dist-info")]
        return None

    def find(self, name: str) -> ConfigClass | None:
        if name in self._cache:
            return self._cache[name]
        found = None
        pattern = re.compile(rf"^class {re.escape(name)}\b", re.MULTILINE)
        for path, text in self._files:
            if pattern.search(text):
                for node in parse(path).body:
                    if isinstance(node, ast.ClassDef) and node.name == name:
                        found = _class_defaults(node, path)
                        break
            if found:
                break
        self._cache[name] = found
        return found

    def lookup(self, name: str, attr: str, depth: int = 0) -> tuple[bool, object]:
        """(found, default) of ``attr`` on config class ``name``, through aliases and base classes."""
        cls = self.find(name)
        if cls is None or depth > 4:
            return False, None
        # an alias reads another field (``num_experts`` -> ``num_local_experts``); transformers 5 declares
        # the default under either name, so both directions are tried
        names = [attr, cls.aliases.get(attr, attr)] + [k for k, v in cls.aliases.items() if v == attr]
        for n in names:
            if n in cls.defaults:
                return True, cls.defaults[n]
        for base in cls.bases:
            if base not in GENERIC:
                ok, v = self.lookup(base, attr, depth + 1)
                if ok:
                    return ok, v
        return False, None


def model_config_classes(tree: ast.Module, index: ConfigIndex) -> list[str]:
    """Config classes a model file names: imported ones the index can read, and ones defined in the file."""
    names = []
    for local, dotted in imported_names(tree).items():
        module = dotted.rsplit(".", 1)[0]
        named = (
            local.endswith("Config") and local not in GENERIC and ("transformers" in module or module.startswith("."))
        )
        if named and index.find(dotted.rsplit(".", 1)[1]) is not None:
            names.append(dotted.rsplit(".", 1)[1])
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Config") and index.find(node.name) is not None:
            names.append(node.name)
    return sorted(set(names))


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def _config_attr(node: ast.AST) -> tuple[str, int | None, tuple[bool, object]] | None:
    """``config.X`` / ``self.config.X[i]`` / ``getattr(config, "X", d)`` -> (X, index, (has default, default))."""
    index = None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
        index, node = node.slice.value, node.value
    if isinstance(node, ast.Attribute) and "config" in ast.unparse(node.value).lower():
        return node.attr, index, (False, None)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and "config" in ast.unparse(node.args[0]).lower()
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        default = (True, literal(node.args[2])) if len(node.args) > 2 else (False, None)
        return node.args[1].value, index, default
    return None


class Resolver:
    """Values of a builder call's arguments from its model's config classes (see the module docstring)."""

    def __init__(self, index: ConfigIndex, tree: ast.Module, linked: list[str] = ()) -> None:  # type: ignore[assignment]
        self.index = index
        self.tree = tree
        named = model_config_classes(tree, index)
        self.classes = sorted(set(named) | {c for c in linked if index.find(c) is not None})

    def _assigned(self, sc: ScopedCall, node: ast.AST) -> list[ast.AST]:
        """Every value ``self.x`` or a local ``x`` is assigned in the call's class or function."""
        found: list[ast.AST] = []
        if isinstance(node, ast.Name) and sc.function is not None and node.id in _params(sc.function):
            found += self._passed_by_callers(sc, node.id)
        if isinstance(node, ast.Name) and sc.function is not None:
            for stmt in ast.walk(sc.function):
                if isinstance(stmt, ast.Assign):
                    targets, assigned = stmt.targets, stmt.value
                elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                    targets, assigned = [stmt.target], stmt.value
                else:
                    continue
                if any(isinstance(t, ast.Name) and t.id == node.id for t in targets):
                    found.append(assigned)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            cls = next((p for p in reversed(sc.parents) if isinstance(p, ast.ClassDef)), None)
            for stmt in ast.walk(cls) if cls is not None else ():
                if isinstance(stmt, ast.Assign | ast.AnnAssign) and getattr(stmt, "value", None) is not None:
                    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                    if any(isinstance(t, ast.Attribute) and ast.unparse(t) == f"self.{node.attr}" for t in targets):
                        found.append(stmt.value)  # type: ignore[arg-type]
        return found

    def _passed_by_callers(self, sc: ScopedCall, param: str) -> list[ast.AST]:
        """What this file's calls of the enclosing class pass for ``param`` of its ``__init__``."""
        if sc.function is None or sc.function.name != "__init__" or sc.cls is None:
            return []
        names = _params(sc.function)
        position = names.index(param) - 1 if param in names else None  # less self
        out: list[ast.AST] = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == sc.cls:
                for kw in node.keywords:
                    if kw.arg == param:
                        out.append(kw.value)
                if position is not None and 0 <= position < len(node.args):
                    out.append(node.args[position])
        return out

    def values(self, sc: ScopedCall, node: ast.AST) -> dict[str, object] | None:
        """What the expression ``node`` can be: {config class: default}, ``literal`` values, a getattr default.

        Follows a conditional's branches and up to three steps of assignment; None when nothing pins it.
        """
        out: dict[str, object] = {}
        literals: set[object] = set()
        frontier, seen = [node], 0
        for _ in range(4):
            nxt: list[ast.AST] = []
            for n in frontier:
                seen += 1
                if seen > 64:
                    break
                if isinstance(n, ast.IfExp):
                    nxt += [n.body, n.orelse]
                    continue
                v = literal(n)
                if v is not NO_LITERAL:
                    if v is not None and _plain(v) and not isinstance(v, list | tuple):
                        literals.add(v)
                    continue
                ref = _config_attr(n)
                if ref is None:
                    nxt += self._assigned(sc, n)
                    continue
                attr, index, (has_default, default) = ref
                hit = False
                for name in self.classes:
                    ok, cv = self.index.lookup(name, attr)
                    if ok and index is not None:
                        ok, cv = (True, cv[index]) if isinstance(cv, list) and index < len(cv) else (False, None)
                    if ok and cv is not None:
                        out[name] = cv
                        hit = True
                if not hit and has_default and _plain(default) and default is not None:
                    out["getattr default"] = default
            frontier = nxt
        if literals:
            out["literal"] = sorted(literals, key=repr)
        return out or None
