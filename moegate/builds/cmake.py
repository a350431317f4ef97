"""vLLM's CMakeLists.txt as commands: what an extension target compiles from, read from the file, never a hand list.

CMake's grammar is small: a command is ``name(arguments)``, an argument is quoted (``"..."``), bracketed
(``[[...]]``) or bare, ``#`` starts a comment. ``commands`` splits a file into its commands with their offsets;
``target_sources`` follows one ``define_extension_target(NAME ... SOURCES ${VAR})`` (vLLM's own helper,
``cmake/utils.cmake``; older releases call it ``define_gpu_extension_target``) back through every ``set``,
``list(APPEND ...)`` and ``file(GLOB ...)`` of the variables it names.

Conditions are not evaluated: a variable's value is the union of everything any branch assigns it (the CUDA and the
ROCm lists alike). For the question asked of it (could a change to this file reach the target?) that errs towards
counting a file, never towards missing one. ``block`` is the target's stretch of the file: from the first statement
that assigns its sources to the last that names the target, whole ``if``/``endif`` blocks included, which is where
vLLM writes a target's generators (``generate_kernels.py``), flags and definitions. ``statement_spans`` gives the
top-level statements so that such a stretch can be cut out whole (``moegate.builds.moe_build`` compiles it).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
_SOURCE_ROOTS = ("${CMAKE_CURRENT_SOURCE_DIR}/", "${CMAKE_CURRENT_LIST_DIR}/", "${CMAKE_SOURCE_DIR}/")
"""How vLLM's CMakeLists names a file of its own tree by absolute path; stripped to the repository-relative path."""
TARGET_DEFINERS = ("define_extension_target", "define_gpu_extension_target")
"""vLLM's helper that makes an extension module (0.33.0's name, and the name releases before it used)."""
TARGET_KEYWORDS = frozenset(
    [
        "DESTINATION",
        "LANGUAGE",
        "SOURCES",
        "ARCHITECTURES",
        "COMPILE_FLAGS",
        "INCLUDE_DIRECTORIES",
        "LIBRARIES",
        "USE_SABI",
        "WITH_SOABI",
    ]
)
"""The keywords of ``define_extension_target`` (``cmake_parse_arguments`` in cmake/utils.cmake)."""
_OPENERS = {"if": "endif", "foreach": "endforeach", "while": "endwhile", "function": "endfunction", "macro": "endmacro"}


class CMakeError(ValueError):
    """A CMakeLists.txt this module cannot read: one line."""


@dataclass(frozen=True)
class Command:
    name: str
    """Lower case: CMake's command names are case-insensitive."""
    args: tuple[str, ...]
    start: int
    end: int
    """Offsets into the text: ``text[start:end]`` is the whole command, name to closing parenthesis."""


@dataclass(frozen=True)
class TargetSources:
    target: str
    variables: tuple[str, ...]
    """The variables its SOURCES name, and every variable they take values from."""
    files: tuple[str, ...]
    """Repository-relative paths, in the order CMake first names them."""
    globs: tuple[str, ...]
    """``file(GLOB ...)`` patterns, repository-relative: files a generator writes at configure time."""
    block_paths: tuple[str, ...]
    """Every other path of the tree named in the target's block: the generator scripts."""
    block: tuple[int, int]
    """Offsets of the target's block (see the module's docstring)."""

    def matches(self, path: str) -> bool:
        """Is ``path`` one of the target's sources, a file its globs take, or a path its block names?"""
        return path in self.files or path in self.block_paths or any(fnmatch.fnmatch(path, g) for g in self.globs)


def _skip_space_and_comments(text: str, i: int) -> int:
    n = len(text)
    while i < n:
        if text[i].isspace():
            i += 1
        elif text[i] == "#":
            bracket = re.match(r"#\[(=*)\[", text[i:])
            if bracket:
                close = text.find("]" + bracket.group(1) + "]", i)
                i = n if close < 0 else close + len(bracket.group(1)) + 2
            else:
                nl = text.find("\n", i)
                i = n if nl < 0 else nl + 1
        else:
            return i
    return i


def _arguments(text: str, i: int) -> tuple[list[str], int]:
    """The arguments of the command whose ``(`` is at ``i - 1``, and the offset after its ``)``."""
    args: list[str] = []
    depth, n = 0, len(text)
    while True:
        i = _skip_space_and_comments(text, i)
        if i >= n:
            raise CMakeError("a command's parenthesis is never closed")
        c = text[i]
        if c == ")":
            if depth == 0:
                return args, i + 1
            depth -= 1
            i += 1
        elif c == "(":
            depth += 1
            i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise CMakeError("a quoted argument is never closed")
            args.append(text[i + 1 : j])
            i = j + 1
        elif c == "[" and (bracket := re.match(r"\[(=*)\[", text[i:])):
            close = text.find("]" + bracket.group(1) + "]", i)
            if close < 0:
                raise CMakeError("a bracket argument is never closed")
            args.append(text[i + len(bracket.group(0)) : close])
            i = close + len(bracket.group(1)) + 2
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in '()"#':
                j += 1
            args.append(text[i:j])
            i = j


def commands(text: str) -> list[Command]:
    """Every command of a CMake file, in order."""
    out: list[Command] = []
    i = _skip_space_and_comments(text, 0)
    while i < len(text):
        m = _NAME.match(text, i)
        if not m:
            raise CMakeError(f"not CMake at offset {i}: {text[i : i + 30]!r}")
        j = _skip_space_and_comments(text, m.end())
        if j >= len(text) or text[j] != "(":
            raise CMakeError(f"{m.group(0)} at offset {i} is not followed by '('")
        args, end = _arguments(text, j + 1)
        out.append(Command(m.group(0).lower(), tuple(args), i, end))
        i = _skip_space_and_comments(text, end)
    return out


def statement_spans(cmds: list[Command]) -> list[tuple[int, int, int]]:
    """The top-level statements: ``(first command index, last command index, start offset)``; an ``if`` (or loop,
    function, macro) through its closing command is one statement."""
    spans, depth, first = [], 0, 0
    closers = set(_OPENERS.values())
    for k, cmd in enumerate(cmds):
        if depth == 0:
            first = k
        if cmd.name in _OPENERS:
            depth += 1
        elif cmd.name in closers:
            depth -= 1
        if depth == 0:
            spans.append((first, k, cmds[first].start))
    return spans


def _relative(item: str) -> str:
    for root in _SOURCE_ROOTS:
        if item.startswith(root):
            return item[len(root) :]
    return item


def _split(items: Iterable[str]) -> list[str]:
    return [part for item in items for part in item.split(";") if part]


def _assignments(cmds: list[Command]) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[int]]]:
    """Per variable: every value any ``set``/``list(APPEND|PREPEND|INSERT)`` gives it, its GLOB patterns, and the
    indices of the commands that assign it."""
    values: dict[str, list[str]] = {}
    globs: dict[str, list[str]] = {}
    where: dict[str, list[int]] = {}
    for k, cmd in enumerate(cmds):
        a = cmd.args
        if cmd.name == "set" and a:
            items = list(a[1:])
            for stop in ("CACHE", "PARENT_SCOPE"):
                if stop in items:
                    items = items[: items.index(stop)]
            var, got = a[0], _split(items)
        elif cmd.name == "list" and len(a) >= 2 and a[0] in ("APPEND", "PREPEND", "INSERT"):
            var, got = a[1], _split(a[3:] if a[0] == "INSERT" else a[2:])
        elif cmd.name == "file" and len(a) >= 2 and a[0] in ("GLOB", "GLOB_RECURSE"):
            var = a[1]
            pats = [p for p in a[2:] if p not in ("LIST_DIRECTORIES", "true", "false", "CONFIGURE_DEPENDS")]
            globs.setdefault(var, []).extend(_relative(p) for p in _split(pats))
            where.setdefault(var, []).append(k)
            continue
        else:
            continue
        values.setdefault(var, []).extend(got)
        where.setdefault(var, []).append(k)
    return values, globs, where


def _keyword_values(args: tuple[str, ...], keyword: str) -> list[str]:
    out, taking = [], False
    for a in args[1:]:
        if a in TARGET_KEYWORDS:
            taking = a == keyword
        elif taking:
            out.append(a)
    return out


def target_names(text: str) -> list[str]:
    """Every extension target the file defines, in order."""
    return [c.args[0] for c in commands(text) if c.name in TARGET_DEFINERS and c.args]


def target_sources(text: str, target: str) -> TargetSources:
    """What extension ``target`` compiles from, read from CMakeLists.txt ``text``; ``CMakeError`` where it is not
    defined there."""
    cmds = commands(text)
    defs = [k for k, c in enumerate(cmds) if c.name in TARGET_DEFINERS and c.args and c.args[0] == target]
    if not defs:
        raise CMakeError(f"no extension target {target} (known: {', '.join(target_names(text)) or 'none'})")
    values, globs, where = _assignments(cmds)
    files: list[str] = []
    patterns: list[str] = []
    seen_vars: list[str] = []

    def take(items: Iterable[str]) -> None:
        for item in items:
            refs = _VAR.findall(item)
            if refs and _VAR.fullmatch(item):
                var = refs[0]
                if var not in seen_vars:
                    seen_vars.append(var)
                    take(values.get(var, []))
                    patterns.extend(p for p in globs.get(var, []) if p not in patterns)
                continue
            path = _relative(item)
            if not _VAR.search(path) and path not in files:
                files.append(path)

    for k in defs:
        take(_keyword_values(cmds[k].args, "SOURCES"))
    first = min((k for v in seen_vars for k in where.get(v, [])), default=defs[0])
    last = max(k for k, c in enumerate(cmds) if target in c.args or any(target in a.split() for a in c.args))
    spans = statement_spans(cmds)
    start = next(s for a, b, s in spans if a <= first <= b)
    stop_cmd = next(b for a, b, _ in spans if a <= last <= b)
    block = (start, cmds[stop_cmd].end)
    named = []
    for c in cmds:
        if block[0] <= c.start < block[1]:
            for a in _split(c.args):
                path = _relative(a)
                if path != a and not _VAR.search(path) and path not in files and path not in named:
                    named.append(path)
    return TargetSources(target, tuple(seen_vars), tuple(files), tuple(patterns), tuple(named), block)
