"""pytest plugin for the power run: how long the dispatch tier took to kill a mutant.

Loaded with ``-p moegate.power.plugin`` into each mutant's dispatch-tier run. It
prints one line (``moegate.power.summary_line``) that the harness reads back from
cosmic-ray's captured output:

- ``first_failure_s``: seconds from the end of the first test's setup (the point
  where the session-scoped ``target`` fixture has imported vLLM) to the first
  failing example. Hypothesis's observability callback reports each test case as
  it finishes, so this is the moment the bug was *seen*, before shrinking; without
  that callback (older Hypothesis) it falls back to the first failing test report.
- ``import_s``: seconds spent up to that point (collection + vLLM import), so the
  report can show the tier's own time apart from the import.
- ``fused_moe_file`` / ``triton_moe_file`` / ``uva_offloader_file`` / ``loader_utils_file``: where the
  modules under test were loaded from (None: not imported), so the harness can prove the run used its
  throw-away overlay for the files it mutates.

It reads module ``__file__`` attributes only; it never drives vLLM.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Generator
from typing import Any

import pytest

from moegate.power import summary_line

# Coverage collection under observability uses sys.settrace on Python 3.11: far too slow.
os.environ.setdefault("HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER", "1")

WATCHED = summary_line.WATCHED


class _Clock:
    """Timestamps of the run, relative to the session start."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.ready: float | None = None  # first test set up: vLLM imported
        self.first_failure: float | None = None
        self.first_failure_test: str | None = None
        self.via: str | None = None
        self.current: str | None = None

    def fail(self, via: str, test: str | None) -> None:
        if self.first_failure is None:
            self.first_failure = time.perf_counter()
            self.first_failure_test = test or self.current
            self.via = via


_clock = _Clock()


def _on_observation(observation: Any, *_: Any) -> None:
    """Hypothesis observability callback: note the first failing test case."""
    if getattr(observation, "type", None) == "test_case" and getattr(observation, "status", None) == "failed":
        _clock.fail("hypothesis-observability", None)


def pytest_configure(config: pytest.Config) -> None:
    try:
        from hypothesis.internal.observability import add_observability_callback  # newer Hypothesis only
    except ImportError:  # older Hypothesis: the failing test report is the fallback
        return
    add_observability_callback(_on_observation)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    _clock.current = item.nodeid
    yield
    if _clock.ready is None:
        _clock.ready = time.perf_counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _clock.fail(f"pytest-{report.when}", report.nodeid)


def summary() -> dict[str, Any]:
    """What the harness reads back; times in seconds, None where nothing happened."""
    ready = _clock.ready if _clock.ready is not None else _clock.start
    out: dict[str, Any] = {
        "import_s": round(ready - _clock.start, 3),
        "total_s": round(time.perf_counter() - _clock.start, 3),
        "first_failure_s": None if _clock.first_failure is None else round(_clock.first_failure - ready, 3),
        "failing_test": _clock.first_failure_test,
        "via": _clock.via,
    }
    for key, name in WATCHED.items():
        mod = sys.modules.get(name)
        out[key] = getattr(mod, "__file__", None) if mod is not None else None
    return out


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(summary_line.render(summary()))
