"""How far a long run is: a live display at a terminal, exactly one line per stage in a log.

The power run, the kernel-tier benchmark, the e2e run and the A/B driver each
take minutes. Each wraps its stages in ``stage(...)`` and reports what it has
done (``advance``/``update``: items done of a total, named counts such as killed
and survived, a detail of what runs now). Where the stream is a terminal the
stage is shown live: a rich progress bar when rich is importable (the dev extra;
vLLM's own environments have it), else one status line rewritten in place. Where
it is not (CI logs, pipes) nothing is written while the stage runs, and one plain
line when it ends, with the same figures, so a log reads as one line per stage.
That final line is written in both cases, so a terminal keeps the same record.

Progress goes to stderr: stdout stays for what a run produces (a report, JSON).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

_live_active = False  # one live display at a time: a stage inside a live one is reported as a plain line


class Stage:
    """One stage of a run: what it has done so far, rendered as one line."""

    def __init__(self, name: str, total: int | None, prefix: str, unit: str, counts: Sequence[str]) -> None:
        self.name, self.total, self.prefix, self.unit = name, total, prefix, unit
        self.done = 0
        self.counts: dict[str, int] = dict.fromkeys(counts, 0)  # shown even while zero, in this order
        self.detail = ""  # what runs now: shown live only
        self.result = ""  # a closing figure (a score, "passed"): shown live and in the final line
        self.started = time.monotonic()
        self.stopped_by: str | None = None
        self._listeners: list[Any] = []

    def advance(self, n: int = 1, **counts: int) -> None:
        """``n`` more items done; ``counts`` are added to the named counts."""
        self.done += n
        for key, value in counts.items():
            self.counts[key] = self.counts.get(key, 0) + value
        self._changed()

    def update(self, done: int | None = None, **counts: int) -> None:
        """Set the figures outright (for progress read back from elsewhere, such as a tool's database)."""
        if done is not None:
            self.done = done
        self.counts.update(counts)
        self._changed()

    def note(self, detail: str) -> None:
        """What runs now (a level, a mutant): shown live, not in the final line."""
        self.detail = detail
        self._changed()

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def figures(self) -> str:
        """Done of total, the counts and the result: the part of the line that changes."""
        parts = []
        if self.stopped_by:
            parts.append(f"stopped by {self.stopped_by}")
        if self.total is not None or self.done:
            of = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
            parts.append(f"{of} {self.unit}".rstrip())
        parts += [f"{key} {value}" for key, value in self.counts.items()]
        if self.result:
            parts.append(self.result)
        return ", ".join(parts)

    def line(self) -> str:
        """The stage as one plain line: ``prefix: name: figures (elapsed s)``."""
        return f"{self.prefix}: {self.name}: {self.figures() or 'done'} ({self.elapsed():.1f} s)"


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


def rich_available() -> bool:
    return importlib.util.find_spec("rich") is not None


@contextmanager
def _rich_display(st: Stage, stream: TextIO) -> Iterator[None]:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        TextColumn("{task.fields[figures]}", markup=False),
        TextColumn("{task.fields[detail]}", markup=False, style="dim"),
        TimeElapsedColumn(),
        console=Console(file=stream),
        transient=True,  # the plain final line replaces the bar
    )
    task = progress.add_task(f"{st.prefix}: {st.name}", total=st.total, figures=st.figures(), detail=st.detail)

    def refresh() -> None:
        progress.update(task, completed=st.done, figures=st.figures(), detail=st.detail)

    st._listeners.append(refresh)
    with progress:
        yield


@contextmanager
def _line_display(st: Stage, stream: TextIO) -> Iterator[None]:
    """A terminal without rich: one status line rewritten in place."""

    def refresh() -> None:
        detail = f" [{st.detail}]" if st.detail else ""
        stream.write(f"\r\x1b[K{st.prefix}: {st.name}: {st.figures()}{detail} ({st.elapsed():.0f} s)")
        stream.flush()

    st._listeners.append(refresh)
    refresh()
    try:
        yield
    finally:
        stream.write("\r\x1b[K")


@contextmanager
def stage(
    name: str,
    total: int | None = None,
    *,
    prefix: str = "moegate",
    unit: str = "",
    counts: Sequence[str] = (),
    stream: TextIO | None = None,
    live: bool | None = None,
) -> Iterator[Stage]:
    """Report a stage of a run; the final line is written however the stage ends (an error names itself).

    ``total``: items the stage will do (None: unknown, e.g. a server start); ``unit``
    names them in the line; ``counts``: counts shown from the start, even at zero.
    ``live``: None decides by whether ``stream`` (default stderr) is a terminal.
    """
    global _live_active
    out = stream if stream is not None else sys.stderr
    st = Stage(name, total, prefix, unit, counts)
    show_live = (_is_terminal(out) if live is None else live) and not _live_active
    display = (_rich_display if rich_available() else _line_display) if show_live else None
    try:
        if display is None:
            yield st
        else:
            _live_active = True
            try:
                with display(st, out):
                    yield st
            finally:
                _live_active = False
    except BaseException as exc:
        st.stopped_by = type(exc).__name__
        raise
    finally:
        st._listeners.clear()
        out.write(st.line() + "\n")
        out.flush()
