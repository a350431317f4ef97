"""The package's layers, held as a contract: every import points down, no two files import each other in a circle.

Walked from the source with ``ast``, imports inside functions included (the kind that hid arrows before:
``e2e/gsm8k_output.py -> serve/recorder.py -> e2e/datasets.py``). A *room* is a package of ``moegate/``
(``core``, ``e2e``...) or one of its top-level modules (``paths``, ``preflight``, ``python -m moegate``'s ``__main__``); the
strategies, at the repository's top level in ``strategies/``, are the room ``strategies`` (installed as
``moegate.strategies``: pyproject.toml's ``package-dir``, read here). ``LAYERS`` names them bottom to top:

- a file may import its own room and any room of a lower layer; rooms of one layer import nothing of each
  other (``builds``, ``census``, ``kernels`` and ``model`` stand side by side, so do ``e2e``, ``ab`` and ``offload``);
- no file reaches itself through imports (a circle between files, even inside one room); imports under
  ``if TYPE_CHECKING:`` count for the layers, not for circles, since they never run;
- an import inside a function is for an optional dependency: a third-party package beyond the two every
  install has (hypothesis, pytest) is one by itself; anything else inside a function carries its reason in a
  comment on the line, and a moegate module so imported must really pull one in (it, or a moegate module
  it imports at its top, imports an optional package at its top).

Each violation prints as ``file:line: what``.
"""

from __future__ import annotations

import ast
import io
import sys
import textwrap
import tokenize
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import ROOT

LAYERS: tuple[tuple[str, ...], ...] = (
    ("moegate",),  # moegate/__init__.py: the version and the checkout's strategies finder, standard library only
    ("paths",),  # where the checkout's data is
    ("core",),  # case, spec, check, goldens, hashing: no vLLM
    ("strategies",),  # the Hypothesis strategies every tier draws from
    ("dispatch",),  # observing vLLM's dispatch (with builds and offload: vLLM's importers); names.py, every vLLM name
    (
        "builds",
        "census",
        "kernels",
        "model",
    ),  # builds, wheels, binaries; the census (text); the kernel tier; tiny models
    ("serve",),  # servers, builds, the client: shared by e2e and the A/B
    ("e2e", "ab", "offload"),  # the e2e gates; the A/B; offload truth's engine runs
    ("power", "preflight", "reach"),  # mutation testing; the runner's preflight; what the tiers exercise (coverage)
    ("cli",),  # the front door: `moegate gate|e2e|ab|sweep|preflight|...`, one module a subcommand
    ("__main__",),  # `python -m moegate`: the front door's alias
)
"""The rooms from the bottom up (docs/layout.md says the same)."""

REQUIRED = frozenset({"hypothesis", "pytest", "_pytest"})
"""Packages every install has (pyproject.toml's ``dependencies``): no reason to import them late."""


@dataclass(frozen=True)
class Import:
    file: str
    """Repository-relative path of the importing file."""
    line: int
    module: str
    """The dotted module imported (for ``from a import b``: ``a.b`` where that is a module, else ``a``)."""
    in_function: bool
    type_only: bool
    """Under ``if TYPE_CHECKING:``."""
    reason: str
    """The comment on the import's lines, if any."""


@dataclass(frozen=True)
class Tree:
    """The modules of ``moegate`` in a checkout: dotted name -> repository-relative file."""

    root: Path
    files: dict[str, str]
    parsed: dict[str, list[Import]] = field(default_factory=dict, compare=False, repr=False)
    """``imports`` of each module, read once."""

    @classmethod
    def read(cls, root: Path) -> Tree:
        mapped = {"moegate": "moegate"}
        pyproject = root / "pyproject.toml"
        if pyproject.is_file():
            setuptools = tomllib.loads(pyproject.read_text()).get("tool", {}).get("setuptools", {})
            mapped.update(setuptools.get("package-dir", {}))
        files = {}
        for package, folder in mapped.items():
            for path in sorted((root / folder).rglob("*.py")):
                parts = path.relative_to(root / folder).with_suffix("").parts
                name = ".".join((package, *parts))
                files[name.removesuffix(".__init__")] = path.relative_to(root).as_posix()
        return cls(root, files)

    def room(self, module: str) -> str:
        """``moegate.e2e.pair`` -> ``e2e``; ``moegate.paths`` -> ``paths``; ``moegate`` -> ``moegate``."""
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else parts[0]

    def is_package(self, module: str) -> bool:
        return self.files[module].endswith("__init__.py")


def _comments(source: str) -> dict[int, str]:
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def imports(tree: Tree, module: str) -> list[Import]:
    """Every import of ``module``'s file, with where it stands."""
    if module not in tree.parsed:
        tree.parsed[module] = _read_imports(tree, module)
    return tree.parsed[module]


def _read_imports(tree: Tree, module: str) -> list[Import]:
    rel = tree.files[module]
    source = (tree.root / rel).read_text(encoding="utf-8")
    comments = _comments(source)
    package = module if tree.is_package(module) else module.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, in_function: bool, type_only: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            reason = " ".join(
                comments[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in comments
            )
            for name in dict.fromkeys(_targets(tree, node, package)):  # `from a import b, c`: one arrow to a
                out.append(Import(rel, node.lineno, name, in_function, type_only, reason))
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function = True
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                visit(child, in_function, True)
            for child in node.orelse:
                visit(child, in_function, type_only)
            return
        for inner in ast.iter_child_nodes(node):
            visit(inner, in_function, type_only)

    visit(ast.parse(source, filename=rel), False, False)
    return out


def _targets(tree: Tree, node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in tree.files else base for a in node.names]


def _top(module: str) -> str:
    return module.split(".")[0]


def _optional(module: str) -> bool:
    top = _top(module)
    return top != "moegate" and top not in sys.stdlib_module_names and top not in REQUIRED and top != "__future__"


def all_imports(tree: Tree) -> list[Import]:
    return [imp for module in tree.files for imp in imports(tree, module)]


def climbing_arrows(tree: Tree, layers: Sequence[Sequence[str]] = LAYERS) -> list[str]:
    """Imports that point to a room of the same or a higher layer, or come from or go to a room not in ``layers``."""
    level = {room: i for i, rooms in enumerate(layers) for room in rooms}
    found = []
    for module in tree.files:
        mine = tree.room(module)
        if mine not in level:
            found.append(f"{tree.files[module]}:1: room {mine!r} is in no layer (place it in LAYERS)")
            continue
        for imp in imports(tree, module):
            if _top(imp.module) != "moegate" or imp.module not in tree.files:
                continue
            theirs = tree.room(imp.module)
            if theirs == mine:
                continue
            if theirs not in level:
                found.append(f"{imp.file}:{imp.line}: imports {imp.module}, whose room {theirs!r} is in no layer")
            elif level[theirs] >= level[mine]:
                how = "a peer" if level[theirs] == level[mine] else "a higher layer"
                found.append(f"{imp.file}:{imp.line}: {mine} imports {imp.module} ({theirs}: {how})")
    return found


def cycles(tree: Tree) -> list[str]:
    """Every circle between files (strongly connected groups of two or more, or a file importing itself)."""
    graph: dict[str, dict[str, int]] = {m: {} for m in tree.files}
    for imp in all_imports(tree):
        if imp.module in tree.files and not imp.type_only:
            src = next(m for m, f in tree.files.items() if f == imp.file)
            graph[src].setdefault(imp.module, imp.line)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[str] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph[v]:
                members = set(group)
                arrows = [
                    f"{tree.files[a]}:{ln} -> {b}" for a in sorted(group) for b, ln in graph[a].items() if b in members
                ]
                found.append("circle: " + "; ".join(arrows))

    for v in graph:
        if v not in index:
            connect(v)
    return found


def _heavy(tree: Tree) -> set[str]:
    """Modules that import an optional package at their top, themselves or through moegate modules they import there."""
    top_level = {m: [i for i in imports(tree, m) if not i.in_function and not i.type_only] for m in tree.files}
    heavy = {m for m, imps in top_level.items() if any(_optional(i.module) for i in imps)}
    grew = True
    while grew:
        grew = False
        for m, imps in top_level.items():
            if m not in heavy and any(i.module in heavy for i in imps):
                heavy.add(m)
                grew = True
    return heavy


def late_imports(tree: Tree) -> list[str]:
    """Function-level imports that are not for an optional dependency, or say no reason."""
    heavy = _heavy(tree)
    found = []
    for imp in all_imports(tree):
        if not imp.in_function or _optional(imp.module):
            continue
        if not imp.reason:
            found.append(f"{imp.file}:{imp.line}: imports {imp.module} inside a function without a reason comment")
        elif imp.module in tree.files and imp.module not in heavy:
            found.append(
                f"{imp.file}:{imp.line}: imports {imp.module} inside a function, but it imports no optional package"
            )
    return found


def _report(found: list[str]) -> str:
    return "\n".join(["", *found])


@pytest.fixture(scope="module")
def tree() -> Tree:
    return Tree.read(ROOT)


def test_every_import_points_down_the_layers(tree):
    found = climbing_arrows(tree)
    assert not found, "imports that climb the layers (tests/unit/test_layers.py LAYERS):" + _report(found)


def test_no_files_import_each_other_in_a_circle(tree):
    found = cycles(tree)
    assert not found, _report(found)


def test_imports_inside_functions_are_for_optional_dependencies_and_say_so(tree):
    found = late_imports(tree)
    assert not found, _report(found)


def test_every_room_is_placed_once(tree):
    rooms = [r for layer in LAYERS for r in layer]
    assert len(rooms) == len(set(rooms)), rooms
    assert {tree.room(m) for m in tree.files} == set(rooms), "a room without files, or files without a room"


# --- the checks can fail: a synthetic tree -------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Tree:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "moegate.strategies" = "strategies" }\n'
    )
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return Tree.read(tmp_path)


def test_a_climbing_import_a_peer_import_and_an_unplaced_room_are_each_named_with_file_and_line(tmp_path):
    tree = _tree(
        tmp_path,
        {
            "moegate/__init__.py": "",
            "moegate/core/__init__.py": "",
            "moegate/core/hashing.py": "import hashlib\n\n\ndef late():\n    from moegate.e2e import run  # climbs\n",
            "moegate/e2e/__init__.py": "",
            "moegate/e2e/run.py": "from moegate.core import hashing\nfrom moegate.ab import driver\n",
            "moegate/ab/__init__.py": "",
            "moegate/ab/driver.py": "from ..core.hashing import late\n",
            "moegate/attic/__init__.py": "",
            "strategies/__init__.py": "from moegate.strategies.moe import cases\nfrom moegate.dispatch import x\n",
            "strategies/moe.py": "cases = 1\n",
            "moegate/dispatch/__init__.py": "",
            "moegate/dispatch/x.py": "",
        },
    )
    assert tree.files["moegate.strategies.moe"] == "strategies/moe.py"
    assert climbing_arrows(tree) == [
        "moegate/attic/__init__.py:1: room 'attic' is in no layer (place it in LAYERS)",
        "moegate/core/hashing.py:5: core imports moegate.e2e.run (e2e: a higher layer)",
        "moegate/e2e/run.py:2: e2e imports moegate.ab.driver (ab: a peer)",
        "strategies/__init__.py:2: strategies imports moegate.dispatch.x (dispatch: a higher layer)",
    ]


def test_a_circle_between_files_is_found_through_a_function_level_import_but_not_a_type_only_one(tmp_path):
    tree = _tree(
        tmp_path,
        {
            "moegate/__init__.py": "",
            "moegate/model/__init__.py": "",
            "moegate/model/a.py": "from moegate.model import b\n",
            "moegate/model/b.py": "def f():\n    from moegate.model.a import g  # reason\n",
            "moegate/model/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from moegate.model import d\n",
            "moegate/model/d.py": "from moegate.model import c\n",
        },
    )
    assert cycles(tree) == ["circle: moegate/model/a.py:1 -> moegate.model.b; moegate/model/b.py:2 -> moegate.model.a"]


def test_a_late_import_needs_a_reason_and_a_moegate_one_an_optional_dependency_behind_it(tmp_path):
    tree = _tree(
        tmp_path,
        {
            "moegate/__init__.py": "",
            "moegate/model/__init__.py": "",
            "moegate/model/heavy.py": "import torch\n",
            "moegate/model/via.py": "from moegate.model import heavy\n",
            "moegate/model/light.py": "import json\n",
            "moegate/model/user.py": textwrap.dedent(
                """\
                def f():
                    import torch
                    import os
                    from moegate.model import via  # via imports torch at its top
                    from moegate.model import light  # no reason really
                    from moegate.model import (  # reason on the first line of two
                        heavy,
                    )
                    import hypothesis
                """
            ),
        },
    )
    assert late_imports(tree) == [
        "moegate/model/user.py:3: imports os inside a function without a reason comment",
        "moegate/model/user.py:5: imports moegate.model.light inside a function, but it imports no optional package",
        "moegate/model/user.py:9: imports hypothesis inside a function without a reason comment",
    ]
