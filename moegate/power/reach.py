"""pytest plugin for the power run: which lines of the mutated files the tests execute at all.

Loaded with ``-p moegate.power.reach`` into one extra run of the unmutated tests when the
harness prunes unreached mutants (``--prune-unreached``). ``MOEGATE_POWER_REACH`` names the
overlay's copies of the mutated files (a JSON list); a trace function follows only frames of
those files and records their line events, on every thread. At the end it prints one line,
``MOEGATE-POWER-REACH {file: [lines]}``, that the harness reads back.

Why pruning is sound: a mutant changes one line; until that line runs, the mutated program runs
exactly as the unmutated one (the power profile is derandomized), so a line the unmutated run never
executes is never executed under its mutant either, and no test can tell the mutant apart. Such a
mutant is reported ``unreached``: a survivor of this tier that needs no run to be known.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from types import FrameType
from typing import Any

ENV = "MOEGATE_POWER_REACH"
MARK = "MOEGATE-POWER-REACH"

_files: set[str] = set()
_lines: dict[str, set[int]] = {}


def _local(frame: FrameType, event: str, arg: Any) -> Any:
    if event == "line":
        _lines[frame.f_code.co_filename].add(frame.f_lineno)
    return _local


def _global(frame: FrameType, event: str, arg: Any) -> Any:
    if event == "call" and frame.f_code.co_filename in _files:
        _lines.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
        return _local
    return None


def pytest_configure(config: Any) -> None:
    files = json.loads(os.environ.get(ENV, "[]"))
    _files.update(files)
    _files.update(os.path.realpath(f) for f in files)
    if _files:
        sys.settrace(_global)
        threading.settrace(_global)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    sys.settrace(None)
    threading.settrace(None)
    terminalreporter.write_line(render({f: sorted(v) for f, v in _lines.items()}))


def render(lines: dict[str, list[int]]) -> str:
    return f"{MARK} {json.dumps(lines, sort_keys=True)}"


def read(output: str | None) -> dict[str, set[int]] | None:
    """The lines each traced file executed, from a run's output (None: no reach line printed)."""
    for line in reversed((output or "").splitlines()):
        if line.startswith(MARK + " "):
            with contextlib.suppress(ValueError):
                return {f: set(v) for f, v in json.loads(line[len(MARK) + 1 :]).items()}
    return None
