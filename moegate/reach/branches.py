"""coverage.py's JSON report, cut down to what the reach report reads: each measured function's branches.

``coverage json`` (format 3, coverage.py 7.x, branch coverage on) lists per file and per function the
executed and missing lines and branches; a branch is an arc ``[from, to]`` between lines (a negative
``to`` leaves the function). ``reduce`` keeps the functions ``moegate.reach.layout`` measures, names
each ``FILE::QUALNAME`` (the file relative to the ``vllm`` folder, module-level code as ``<module>``),
and records per function:

- ``executed``: the lines that ran; ``statements``: how many it has;
- ``arcs``: every branch as ``[from, to, taken]`` (``taken`` 1 or 0);
- ``text``: the source line each branch leaves from, stripped, so a reviewed reason can name a branch by
  what it tests rather than by a line number that moves between releases.

``@triton.jit`` functions are left out (Python never runs their bodies): ``triton`` lists them, and
the specialisation recorder measures them.

``merge`` joins several runs' reductions (the dispatch tier on a CPU, both tiers on a GPU): a line ran,
or a branch was taken, when it did in any run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from moegate.reach.layout import MODULE, Layout

Functions = dict[str, dict[str, Any]]


class CoverageFormatError(ValueError):
    """A coverage JSON report this module cannot read; the message is one line."""


def _rel(path: str, root: Path) -> str | None:
    p = Path(path)
    for base in (root, root.resolve()):
        try:
            return p.resolve().relative_to(base.resolve()).as_posix() if p.is_absolute() else None
        except ValueError:
            continue
    return None


def reduce(report: Mapping[str, Any], layout: Layout) -> tuple[Functions, list[str]]:
    """(functions, triton kernels) of the measured part, from a coverage JSON ``report``."""
    meta = report.get("meta", {})
    if not meta.get("branch_coverage"):
        raise CoverageFormatError("reach: the coverage report has no branch data (coverage run --branch)")
    if "files" not in report:
        raise CoverageFormatError("reach: the coverage report has no 'files' (not a coverage.py JSON report)")
    sources: dict[str, list[str]] = {}
    out: Functions = {}
    for path, data in report["files"].items():
        rel = _rel(path, layout.source.root)
        if rel is None or rel not in layout.files:
            continue
        if "functions" not in data:
            raise CoverageFormatError(f"reach: coverage {meta.get('version')} wrote no per-function data; needs 7.6+")
        lines = sources.setdefault(rel, (layout.source.root / rel).read_text(encoding="utf-8").splitlines())
        for qual, fn in data["functions"].items():
            name = qual or MODULE
            key = f"{rel}::{name}"
            if key in layout.triton or not layout.measures(rel, name):
                continue
            executed = sorted(fn["executed_lines"])
            statements = len(executed) + len(fn["missing_lines"])
            if not statements:
                continue
            arcs = sorted(
                [[a, b, 1] for a, b in fn["executed_branches"]] + [[a, b, 0] for a, b in fn["missing_branches"]]
            )
            text = {str(a): lines[a - 1].strip() for a in sorted({arc[0] for arc in arcs}) if 0 < a <= len(lines)}
            out[key] = {"executed": executed, "statements": statements, "arcs": arcs, "text": text}
    triton = sorted(k for k in layout.triton if k.split("::")[0] in layout.files)
    return out, triton


def merge(runs: Iterable[Functions]) -> Functions:
    """One reduction from several runs' (see the module docstring)."""
    out: Functions = {}
    for functions in runs:
        for key, fn in functions.items():
            have = out.get(key)
            if have is None:
                out[key] = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                            for k, v in fn.items()}  # fmt: skip
                out[key]["arcs"] = [list(a) for a in fn["arcs"]]
                continue
            have["executed"] = sorted(set(have["executed"]) | set(fn["executed"]))
            have["statements"] = max(have["statements"], fn["statements"])
            taken = {(a, b): t for a, b, t in have["arcs"]}
            for a, b, t in fn["arcs"]:
                taken[(a, b)] = max(taken.get((a, b), 0), t)
            have["arcs"] = [[a, b, t] for (a, b), t in sorted(taken.items())]
            have["text"] = {**fn["text"], **have["text"]}
    return out


def reached(fn: Mapping[str, Any]) -> bool:
    """Did any line of the function run?"""
    return bool(fn["executed"])


def dumps(data: Mapping[str, Any], wide: Iterable[str] = ("functions", "branches")) -> str:
    """``data`` as JSON a reviewer can diff: keys sorted, each entry of the ``wide`` maps on a line of its own."""
    wide = set(wide)
    items = sorted(data.items())
    lines = ["{"]
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key in wide and isinstance(value, Mapping) and value:
            inner = sorted(value.items())
            lines.append(f" {json.dumps(key)}: {{")
            for j, (k, v) in enumerate(inner):
                sep = "," if j < len(inner) - 1 else ""
                lines.append(f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True, separators=(',', ':'))}{sep}")
            lines.append(" }" + comma)
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, sort_keys=True)}{comma}")
    return "\n".join(lines + ["}"]) + "\n"
