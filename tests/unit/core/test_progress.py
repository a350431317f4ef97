"""Progress of long runs: one plain line per stage in a log, a live display only at a terminal.

- not a terminal (a CI log, a pipe): nothing while a stage runs, exactly one line
  when it ends, with the counts it was given;
- a stage ended by an error still writes its line, naming the error, and the error propagates;
- a terminal without rich: one status line rewritten in place, then the same final line;
- a terminal with rich: a live bar (needs rich, which the unit environment lacks;
  the power tool's environment has it through cosmic-ray).
"""

from __future__ import annotations

import importlib.util
import io
import re

import pytest

from moegate.core import progress

pytestmark = pytest.mark.unit


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_log_gets_one_line_per_stage_at_its_end_with_the_counts() -> None:
    log = io.StringIO()
    with progress.stage("mutants", 3, prefix="power", counts=("killed", "survived"), stream=log) as bar:
        bar.advance(killed=1)
        bar.note("mutant 2")
        bar.advance(killed=1)
        bar.advance(survived=1, timeout=0)
        assert log.getvalue() == ""  # quiet while the stage runs
        bar.result = "score 66.7 %"
    with progress.stage("report", prefix="power", stream=log):
        pass
    lines = log.getvalue().splitlines()
    assert len(lines) == 2
    assert re.fullmatch(
        r"power: mutants: 3/3, killed 2, survived 1, timeout 0, score 66\.7 % \(\d+\.\d s\)", lines[0]
    ), lines[0]
    assert "mutant 2" not in lines[0]  # the live detail is not part of the record
    assert re.fullmatch(r"power: report: done \(\d+\.\d s\)", lines[1]), lines[1]


def test_update_sets_figures_read_back_from_elsewhere() -> None:
    log = io.StringIO()
    with progress.stage("mutants", 75, prefix="power", counts=("killed", "survived"), stream=log) as bar:
        bar.update(10, killed=9, survived=1)
        bar.update(12, killed=11)
    assert log.getvalue().startswith("power: mutants: 12/75, killed 11, survived 1 (")


def test_units_and_an_unknown_total() -> None:
    log = io.StringIO()
    with progress.stage("base: greedy", 3, prefix="e2e", unit="passes", stream=log) as bar:
        bar.advance()
    with progress.stage("cases", prefix="bench", stream=log) as bar:
        bar.advance(5)
    assert [ln.split(" (")[0] for ln in log.getvalue().splitlines()] == [
        "e2e: base: greedy: 1/3 passes",
        "bench: cases: 5",
    ]


def test_a_stage_ended_by_an_error_says_so_and_the_error_propagates() -> None:
    log = io.StringIO()
    with pytest.raises(KeyboardInterrupt), progress.stage("mutants", 75, prefix="power", stream=log) as bar:
        bar.advance(12)
        raise KeyboardInterrupt
    assert log.getvalue().startswith("power: mutants: stopped by KeyboardInterrupt, 12/75 (")
    assert log.getvalue().count("\n") == 1


def test_a_dumb_terminal_is_a_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    out = Terminal()
    with progress.stage("x", 2, stream=out) as bar:
        bar.advance()
        assert out.getvalue() == ""
    assert out.getvalue().count("\n") == 1


def test_a_terminal_without_rich_rewrites_one_status_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "rich_available", lambda: False)
    monkeypatch.setenv("TERM", "xterm")
    out = Terminal()
    with progress.stage("cases", 4, prefix="bench", counts=("failed",), stream=out) as bar:
        bar.advance()
        bar.note("legacy")
        bar.advance(failed=1)
        shown = out.getvalue()
    assert "\n" not in shown  # one line, rewritten in place
    assert "\r\x1b[Kbench: cases: 2/4, failed 1 [legacy]" in shown
    final = out.getvalue()[len(shown) :]
    assert re.fullmatch(r"\r\x1b\[Kbench: cases: 2/4, failed 1 \(\d+\.\d s\)\n", final), repr(final)


def test_a_stage_inside_a_live_one_is_a_plain_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "rich_available", lambda: False)
    monkeypatch.setenv("TERM", "xterm")
    outer, inner = Terminal(), Terminal()
    with progress.stage("outer", stream=outer), progress.stage("inner", stream=inner):
        assert inner.getvalue() == ""
    assert inner.getvalue().startswith("moegate: inner: done (")
    with progress.stage("again", stream=inner):  # the live slot is free again
        assert inner.getvalue().split("\n", 1)[1].startswith("\r\x1b[Kmoegate: again")


@pytest.mark.skipif(
    importlib.util.find_spec("rich") is None,
    reason="needs rich (the dev extra; the power tool's environment has it through cosmic-ray)",
)
def test_a_terminal_with_rich_shows_a_bar_and_keeps_the_final_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    out = Terminal()
    with progress.stage("mutants [x]", 2, prefix="power", counts=("killed",), stream=out) as bar:
        bar.advance(killed=1)
    text = out.getvalue()
    assert "━" in text  # the bar was drawn
    assert re.search(r"power: mutants \[x\]: 1/2, killed 1 \(\d+\.\d s\)\n$", text), text[-300:]
