"""Which files of a vLLM tree the fused-MoE ops compile from, each with the reason it counts.

Read from the tree, at one commit or in a folder (``Tree``), with no vLLM import:

1. every source of the ``_moe_C`` extension (0.33.0: ``_moe_C_stable_libtorch``; topk softmax, moe sum, the block
   alignment, the wNa16 and Marlin MoE GEMMs), as its CMakeLists.txt lists them (``moegate.builds.cmake``),
   the files its globs take and the generators its CMake block runs;
2. the sources of the ``_C`` extension that define an op the fused-MoE package calls: the op names are read from
   the package's Python (``torch.ops._C.NAME``, and ``ops.NAME`` through ``vllm/_custom_ops.py``), the defining
   file is the ``_C`` source with a function body of that name (0.33.0: the activations, ``silu_and_mul`` and
   kin, and the fp8 quantization the fused MoE calls);
3. what those files ``#include`` from the tree, transitively: a header resolves against the including file's
   folder, then ``csrc/`` (the include path ``define_extension_target`` gives every target).

Nothing else: another kernel's source (``csrc/attention``) counts only where a MoE source includes it.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from moegate.builds.cmake import CMakeError, TargetSources, target_names, target_sources
from moegate.dispatch.names import FUSED_MOE_PKG

CMAKELISTS = "CMakeLists.txt"
CSRC = "csrc"
FUSED_MOE_DIR = FUSED_MOE_PKG.replace(".", "/")
CUSTOM_OPS = "vllm/_custom_ops.py"
C_SUFFIXES = (".c", ".cc", ".cpp", ".cu", ".h", ".hh", ".hpp", ".cuh", ".inl", ".inc")
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^">]+)[">]', re.MULTILINE)
_DIRECT_C_OP = re.compile(r"torch\.ops\._C\.([A-Za-z_]\w*)")
_OPS_CALL = re.compile(r"\b(?:ops|_custom_ops)\.([A-Za-z_]\w*)\s*\(")


def is_moe_target(name: str) -> bool:
    return name == "_moe_C" or name.startswith("_moe_C_")


def is_c_target(name: str) -> bool:
    return name == "_C" or name.startswith("_C_")


class Tree(Protocol):
    """A vLLM source tree: its files' paths (repository-relative, ``/``-separated) and their texts."""

    def paths(self) -> frozenset[str]: ...

    def read(self, path: str) -> str | None: ...


class DirTree:
    """A folder: a checkout's working tree, an unpacked sdist."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._paths: frozenset[str] | None = None

    def paths(self) -> frozenset[str]:
        if self._paths is None:
            self._paths = frozenset(
                p.relative_to(self.root).as_posix()
                for p in self.root.rglob("*")
                if p.is_file() and ".git" not in p.parts
            )
        return self._paths

    def read(self, path: str) -> str | None:
        try:
            return (self.root / path).read_text(errors="replace")
        except OSError:
            return None


class GitTree:
    """One commit of a git repository, read with ``git ls-tree`` and ``git cat-file`` (nothing is checked out)."""

    def __init__(self, repo: str | Path, commit: str):
        self.repo, self.commit = str(repo), commit
        self._paths: frozenset[str] | None = None
        self._texts: dict[str, str | None] = {}

    def paths(self) -> frozenset[str]:
        if self._paths is None:
            out = subprocess.run(
                ["git", "-C", self.repo, "ls-tree", "-r", "-z", "--name-only", self.commit],
                capture_output=True, check=True,
            ).stdout  # fmt: skip
            self._paths = frozenset(p.decode() for p in out.split(b"\0") if p)
        return self._paths

    def read(self, path: str) -> str | None:
        if path not in self._texts:
            if path not in self.paths():
                self._texts[path] = None
            else:
                r = subprocess.run(
                    ["git", "-C", self.repo, "cat-file", "blob", f"{self.commit}:{path}"],
                    capture_output=True,
                    check=False,
                )
                self._texts[path] = r.stdout.decode(errors="replace") if r.returncode == 0 else None
        return self._texts[path]


@dataclass(frozen=True)
class MoeSources:
    reasons: dict[str, str]
    """Path -> why the fused-MoE ops compile from it."""
    targets: dict[str, frozenset[str]]
    """Path -> the extension targets it reaches (a ``_moe_C`` source: that target; a ``_C`` op's: the ``_C`` one)."""
    moe_targets: tuple[TargetSources, ...]
    """The ``_moe_C`` targets as CMake defines them."""
    c_ops: tuple[str, ...]
    """The ``_C`` ops the fused-MoE package calls."""


def _globbed(paths: Iterable[str], patterns: Iterable[str]) -> list[str]:
    pats = list(patterns)
    return sorted(p for p in paths if any(fnmatch.fnmatch(p, g) for g in pats))


def fused_moe_c_ops(tree: Tree) -> tuple[str, ...]:
    """The ``_C`` ops the fused-MoE package calls, directly or through ``vllm/_custom_ops.py``."""
    texts = [
        tree.read(p) or "" for p in sorted(tree.paths()) if p.startswith(FUSED_MOE_DIR + "/") and p.endswith(".py")
    ]
    direct = {m for t in texts for m in _DIRECT_C_OP.findall(t)}
    wrappers = {m for t in texts for m in _OPS_CALL.findall(t)}
    custom = tree.read(CUSTOM_OPS) or ""
    for name, body in _top_level_defs(custom):
        if name in wrappers or name == "*":
            direct |= set(_DIRECT_C_OP.findall(body))
    return tuple(sorted(direct))


def _top_level_defs(text: str) -> list[tuple[str, str]]:
    """(name, source) of each top-level function of a Python file, parsed, never imported; a file that does not
    parse is one body named ``*``, so that every op it names counts."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return [("*", text)]
    lines = text.splitlines(keepends=True)
    return [
        (node.name, "".join(lines[node.lineno - 1 : node.end_lineno]))
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def defines(text: str, name: str) -> bool:
    """Does C++ ``text`` define (with a body, not only declare) a function ``name``? Comments are read as blanks."""
    text = _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    for m in re.finditer(rf"^[ \t]*(?:[\w:<>,]+[ \t*&]+)+{re.escape(name)}[ \t]*\(", text, re.MULTILINE):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        rest = text[i:].lstrip()
        rest = re.sub(r"^(?:const|noexcept|override|final)\b\s*", "", rest)
        if rest.startswith("{"):
            return True
    return False


def resolve_include(tree_paths: frozenset[str], including: str, name: str) -> str | None:
    """The tree's file an ``#include`` names, as vLLM's targets find it: beside the includer, then under csrc/."""
    for base in (str(Path(including).parent), CSRC):
        candidate = Path(base, name).as_posix()
        parts: list[str] = []
        for part in candidate.split("/"):
            if part == "..":
                if parts:
                    parts.pop()
            elif part not in ("", "."):
                parts.append(part)
        path = "/".join(parts)
        if path in tree_paths:
            return path
    return None


def include_closure(tree: Tree, seeds: dict[str, str]) -> dict[str, str]:
    """``seeds`` (path -> reason) and every file of the tree they include, transitively, each with its includer."""
    reasons = dict(seeds)
    queue = [p for p in seeds if p.endswith(C_SUFFIXES)]
    paths = tree.paths()
    while queue:
        path = queue.pop(0)
        for name in _INCLUDE.findall(tree.read(path) or ""):
            found = resolve_include(paths, path, name)
            if found and found not in reasons:
                reasons[found] = f"included by {path}"
                queue.append(found)
    return reasons


def moe_sources(tree: Tree) -> MoeSources:
    """The files the fused-MoE ops compile from (see the module's docstring); ``CMakeError`` where the tree has no
    readable CMakeLists.txt with a ``_moe_C`` target."""
    text = tree.read(CMAKELISTS)
    if text is None:
        raise CMakeError(f"no {CMAKELISTS}: not a vLLM source tree")
    names = target_names(text)
    moe = [target_sources(text, n) for n in names if is_moe_target(n)]
    if not moe:
        raise CMakeError(f"{CMAKELISTS} defines no _moe_C extension (targets: {', '.join(names) or 'none'})")
    paths = tree.paths()
    groups: list[tuple[str, dict[str, str]]] = []
    for t in moe:
        seeds = {p: f"a source of {t.target}" for p in [*t.files, *_globbed(paths, t.globs)]}
        for p in t.block_paths:
            seeds.setdefault(p, f"named in {t.target}'s CMake block")
        groups.append((t.target, seeds))
    ops = fused_moe_c_ops(tree)
    for name in (n for n in names if is_c_target(n)):
        c = target_sources(text, name)
        seeds = {}
        for p in [*c.files, *_globbed(paths, c.globs)]:
            body = (tree.read(p) or "") if p.endswith(C_SUFFIXES) else ""
            hit = [op for op in ops if op in body and defines(body, op)]
            if hit:
                seeds[p] = f"defines {name} op{'s' if len(hit) > 1 else ''} {', '.join(hit)}, which the fused MoE calls"
        groups.append((name, seeds))
    reasons: dict[str, str] = {}
    targets: dict[str, set[str]] = {}
    for target, seeds in groups:
        for path, why in include_closure(tree, seeds).items():
            reasons.setdefault(path, why)
            targets.setdefault(path, set()).add(target)
    return MoeSources(reasons, {p: frozenset(t) for p, t in targets.items()}, tuple(moe), ops)
