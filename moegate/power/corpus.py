"""The real-bug corpus: fused-MoE bugs vLLM shipped and fixed, re-planted into a copy of its Python.

``power/real-bugs.toml`` holds each bug with its provenance (the upstream pull request, what the bug
did) and its re-plant: edits, each a ``find`` replaced by ``replace`` inside one function (``scope``:
``func`` or ``Class.method``) of one file of the ``vllm`` package, found by parsing the file, never
by line number. ``find`` must occur there exactly ``count`` times, so a release that moved the code
refuses the re-plant by name instead of planting something else; the edited file must still parse
and must differ from the original.

A bug is planted into a throw-away overlay (``mirror``: the package's directory tree made of real
directories, each file a symlink to the installed one, the edited files real copies) that goes first
on a build's path (``moegate.builds.planted.make_build``); the installed files are only read. Real
directories, not symlinked ones, because the census (``moegate.census``) walks the package with
``rglob``, which does not descend into a symlinked directory; the baseline is the same mirror without
an edit, so whatever the mirror itself changes shows in the baseline. vLLM is text here, never
imported.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from moegate.core.hashing import text_sha256
from moegate.paths import ROOT
from moegate.power.errors import PowerError
from moegate.power.regions import find_function

CORPUS = ROOT / "power" / "real-bugs.toml"
TIERS = ("dispatch", "kernels", "diff")
EXPECT = (*TIERS, "survives")
_BUG_KEYS = {"id", "upstream", "url", "title", "what", "expect", "expect_test", "survives", "edit"}
_EDIT_KEYS = {"file", "scope", "find", "replace", "count"}


class CorpusError(PowerError):
    """A corpus file or a re-plant that cannot be used; the message is one line."""


@dataclass(frozen=True)
class Edit:
    """``find`` replaced by ``replace`` inside function ``scope`` of ``file`` (relative to the vllm package)."""

    file: str
    scope: str
    find: str
    replace: str
    count: int = 1


@dataclass(frozen=True)
class Bug:
    """One re-planted bug: its provenance, its edits and the tier expected to kill it."""

    id: str
    upstream: str
    url: str
    title: str
    what: str
    expect: str
    edits: tuple[Edit, ...]
    expect_test: str = ""
    survives: str = ""
    """The reviewed explanation, should it survive (required where ``expect`` is "survives")."""

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.file for e in self.edits))

    @property
    def fingerprint(self) -> str:
        """sha256 of the re-plant (its edits): a run's result holds it, so a page can tell a result the corpus
        has since re-planted differently."""
        text = json.dumps([dataclasses.astuple(e) for e in self.edits])
        return text_sha256(text)


def _text(entry: Mapping[str, object], key: str, where: str, *, required: bool = True) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise CorpusError(f"{where}: '{key}' must be a non-empty string")
    return value


def _edit(raw: object, where: str) -> Edit:
    if not isinstance(raw, dict):
        raise CorpusError(f"{where}: an edit is a table with file, scope, find, replace")
    unknown = sorted(set(raw) - _EDIT_KEYS)
    if unknown:
        raise CorpusError(f"{where}: unknown key {unknown[0]!r} (an edit has {', '.join(sorted(_EDIT_KEYS))})")
    count = raw.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise CorpusError(f"{where}: 'count' must be a whole number >= 1")
    file = _text(raw, "file", where)
    if Path(file).is_absolute() or ".." in Path(file).parts or not file.endswith(".py"):
        raise CorpusError(f"{where}: 'file' {file!r} must be a .py path inside the vllm package")
    return Edit(
        file, _text(raw, "scope", where), _text(raw, "find", where), _text(raw, "replace", where, required=False), count
    )


def parse(text: str, where: str = str(CORPUS)) -> tuple[Bug, ...]:
    """The corpus in ``text`` (the TOML above), checked; ``CorpusError`` names the first problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise CorpusError(f"{where}: not TOML ({exc})") from None
    raws = data.get("bug")
    if not isinstance(raws, list) or not raws:
        raise CorpusError(f"{where}: no [[bug]] entries")
    bugs: list[Bug] = []
    for i, raw in enumerate(raws):
        at = f"{where}: bug {i + 1}"
        unknown = sorted(set(raw) - _BUG_KEYS)
        if unknown:
            raise CorpusError(f"{at}: unknown key {unknown[0]!r}")
        bug_id = _text(raw, "id", at)
        at = f"{where}: bug {bug_id!r}"
        expect = _text(raw, "expect", at)
        if expect not in EXPECT:
            raise CorpusError(f"{at}: 'expect' is one of {', '.join(EXPECT)}, not {expect!r}")
        edits = raw.get("edit")
        if not isinstance(edits, list) or not edits:
            raise CorpusError(f"{at}: no [[bug.edit]]")
        bug = Bug(
            id=bug_id,
            upstream=_text(raw, "upstream", at),
            url=_text(raw, "url", at),
            title=_text(raw, "title", at),
            what=_text(raw, "what", at),
            expect=expect,
            edits=tuple(_edit(e, f"{at}, edit {j + 1}") for j, e in enumerate(edits)),
            expect_test=_text(raw, "expect_test", at, required=False),
            survives=_text(raw, "survives", at, required=expect == "survives"),
        )
        if any(b.id == bug.id for b in bugs):
            raise CorpusError(f"{at}: the id is used twice")
        bugs.append(bug)
    return tuple(bugs)


def load(path: Path = CORPUS) -> tuple[Bug, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CorpusError(f"{path}: cannot read the corpus ({exc.strerror})") from None
    return parse(text, str(path))


def select(bugs: Sequence[Bug], only: Sequence[str]) -> tuple[Bug, ...]:
    """The bugs named in ``only`` (all when empty), in corpus order; an unknown id is one line."""
    known = {b.id for b in bugs}
    missing = [i for i in only if i not in known]
    if missing:
        raise CorpusError(f"--only {missing[0]}: no such bug in the corpus (it has: {', '.join(sorted(known))})")
    return tuple(b for b in bugs if not only or b.id in only)


def scope_span(source: str, scope: str) -> tuple[int, int]:
    """Character offsets [start, end) of function ``scope``'s source (``func`` or ``Class.method``, top level:
    ``moegate.power.regions.find_function``, as the mutation regions find theirs)."""
    node = find_function(ast.parse(source), scope)
    if node is None:
        raise LookupError(scope)
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts[node.lineno - 1], starts[node.end_lineno or node.lineno]


def apply_edits(sources: Mapping[str, str], edits: Sequence[Edit], where: str = "") -> dict[str, str]:
    """The edited text of each file ``edits`` touch, edits applied in order; ``CorpusError`` on any mismatch."""
    out: dict[str, str] = {}
    for edit in edits:
        if edit.file not in sources:
            raise CorpusError(f"{where}: {edit.file} is not in the vllm package")
        text = out.get(edit.file, sources[edit.file])
        try:
            start, end = scope_span(text, edit.scope)
        except LookupError:
            raise CorpusError(f"{where}: {edit.file} has no function {edit.scope}") from None
        segment = text[start:end]
        found = segment.count(edit.find)
        if found != edit.count:
            raise CorpusError(
                f"{where}: {edit.file}::{edit.scope} holds {edit.find!r} {found} times, the re-plant expects "
                f"{edit.count}"
            )
        out[edit.file] = text[:start] + segment.replace(edit.find, edit.replace) + text[end:]
    for file, text in out.items():
        try:
            ast.parse(text)
        except SyntaxError as exc:
            raise CorpusError(f"{where}: the re-planted {file} does not parse (line {exc.lineno}: {exc.msg})") from None
        if text == sources[file]:
            raise CorpusError(f"{where}: the re-plant leaves {file} unchanged")
    return out


def replant(bug: Bug, package_dir: Path) -> dict[str, str]:
    """``bug``'s edited files (relative path -> text), read from the installed ``package_dir``, which is not written."""
    sources: dict[str, str] = {}
    for f in bug.files:
        path = package_dir / f
        if not path.is_file():
            raise CorpusError(f"bug {bug.id!r}: {f} is not in {package_dir}")
        sources[f] = path.read_text(encoding="utf-8")
    return apply_edits(sources, bug.edits, where=f"bug {bug.id!r}")


def mirror(package_dir: Path, overlay_root: Path, edited: Mapping[str, str]) -> Path:
    """``package_dir`` mirrored under ``overlay_root`` (real directories, files as symlinks, no ``__pycache__``),
    each file of ``edited`` (relative path -> text) a real file instead; returns ``overlay_root``."""
    dst_pkg = overlay_root / package_dir.name
    for here, dirs, files in os.walk(package_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = Path(here).relative_to(package_dir)
        (dst_pkg / rel).mkdir(parents=True, exist_ok=True)
        for name in files:
            f = (rel / name).as_posix()
            if f in edited:
                (dst_pkg / rel / name).write_text(edited[f], encoding="utf-8")  # a new inode: never the installed file
            else:
                os.symlink(Path(here) / name, dst_pkg / rel / name)
    missing = sorted(f for f in edited if not (dst_pkg / f).is_file() or (dst_pkg / f).is_symlink())
    if missing:
        raise CorpusError(f"{missing[0]} is not in {package_dir}")
    return overlay_root


def plant(bug: Bug | None, package_dir: Path, overlay_root: Path) -> Path:
    """An overlay under ``overlay_root`` holding ``package_dir`` with ``bug`` re-planted (None: the unedited mirror,
    the baseline); returns ``overlay_root``. Put it first on a build's path and ``import vllm`` finds it."""
    return mirror(package_dir, overlay_root, replant(bug, package_dir) if bug is not None else {})
