"""Golden files: reviewable text, compared byte for byte, changed only by an explicit bless.

Each golden starts with ``#`` provenance lines (what produced it, with which
versions, when). Those lines are not compared, so a re-run on a newer torch does
not cry wolf; the body is. On a mismatch the new body is written beside the
golden as ``NAME.obtained`` (pytest-regressions' convention) and the error shows
a unified diff; the golden itself is only rewritten by ``bless``.
"""

from __future__ import annotations

import datetime as _dt
import difflib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from moegate.paths import GOLDEN_DIR  # the one place for data paths (installed or from a checkout)

BLESS_HINT = "nox -s bless -- {name}   (or: pytest --bless ...)"


class GoldenMismatch(AssertionError):
    pass


class GoldenMissing(AssertionError):
    pass


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def provenance_header(fields: Mapping[str, str]) -> str:
    stamp = {"date": _dt.date.today().isoformat(), **fields}
    return "".join(f"# {k}: {v}\n" for k, v in stamp.items())


def body(text: str) -> str:
    """The compared part of a golden: everything but ``#`` lines."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


def obtained_path(path: Path) -> Path:
    """Where a mismatch's obtained text goes: beside the golden, or in ``MOEGATE_OBTAINED_DIR`` where that is set.
    The meta-check's base run (vLLM 0.32.0, which must mismatch) sets it: the test command runs it beside the dispatch
    tier on 0.33.0, whose pass removes the obtained file beside the golden, and once did so before the meta-check
    read it (2026-12-02, a warm run whose lanes overlapped the two)."""
    where = os.environ.get("MOEGATE_OBTAINED_DIR")
    return (Path(where) if where else path.parent) / (path.name + ".obtained")


def check(
    name: str,
    text: str,
    *,
    bless: bool = False,
    directory: Path = GOLDEN_DIR,
    max_diff_lines: int = 80,
    hint: str | None = None,
) -> None:
    """Compare ``text`` with golden ``name``; with ``bless`` write it instead.

    ``hint``: the command that blesses this golden, when it is not ``nox -s bless -- NAME``.
    """
    path = directory / name
    how = hint or BLESS_HINT.format(name=name)
    obtained = obtained_path(path)
    if bless:
        atomic_write(path, text)
        obtained.unlink(missing_ok=True)
        return
    if not path.exists():
        atomic_write(obtained, text)
        raise GoldenMissing(f"golden {path} is missing; review {obtained} and bless it: {how}")
    want = body(path.read_text(encoding="utf-8"))
    got = body(text)
    if want == got:
        obtained.unlink(missing_ok=True)
        return
    atomic_write(obtained, text)
    diff = list(difflib.unified_diff(want.splitlines(), got.splitlines(), str(path), str(obtained), lineterm="", n=0))
    shown = diff[:max_diff_lines]
    more = len(diff) - len(shown)
    raise GoldenMismatch(
        f"{name} differs from the golden ({sum(1 for d in diff if d.startswith('-') and not d.startswith('---'))} rows "
        f"changed); obtained file: {obtained}; if the change is intended: {how}\n"
        + "\n".join(shown)
        + (f"\n... {more} more diff lines" if more > 0 else "")
    )
