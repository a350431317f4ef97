"""pytest plugin for the real-bug corpus: end a gate's run at its first failing behaviour test.

Loaded with ``-p moegate.power.corpus_stop`` into each planted build's ``moegate gate`` run (the
corpus runner passes it after the gate's ``--``). A kill needs one failing behaviour test, and a
survivor runs the whole gate anyway, so stopping there saves the device time of every killed bug
without changing a verdict. A failing *review* test does not stop the run: it says a reviewed
source record changed, not what the code computes, so the tiers after it must still run.

The plugin also runs a gate's tests cheapest kill first (``run_order``): the kernel tier's tests that start no
vLLM engine, then the dispatch tier, then the files that start engines or capture CUDA graphs (minutes of a gate
that kill no bug of the corpus first). The order changes when a kill comes, not whether: the tests are the same.

``REVIEW_TESTS`` is that list: tests that read vLLM's source text (the census) and hold it to a
reviewed golden. They fail on any edit of a dispatch site, whatever it computes, so a bug they
alone catch is *flagged*, not killed by behaviour (``moegate.power.corpus_report``).
"""

from __future__ import annotations

from typing import Any

import pytest

REVIEW_TESTS = (
    "tests/dispatch/test_census.py::",
    "tests/dispatch/test_census_bad_input.py::",
    "tests/dispatch/test_dispatch_sites.py::test_every_site_of_the_installed_vllm_is_checked_somewhere_or_says_why",
    "tests/dispatch/test_dispatch_sites.py::test_the_exceptions_are_the_two_callers_the_change_description_names",
)
"""Node-id prefixes of the tests that judge vLLM's source against a reviewed record, not its behaviour."""


LAST_FILES = (
    "tests/kernels/test_cuda_graphs.py",
    "tests/kernels/test_e2e_decode_region.py",
    "tests/kernels/test_layer_lifecycle.py",
    "tests/kernels/test_offload_truth.py",
)
"""The kernel tier's slow files: engine starts (30-80 s each) or the first CUDA-graph capture (about 23 s), measured
on the H200 (results/census.md, "Where the time goes")."""


def run_order(nodeid: str) -> int:
    """0: a kernel test that starts no engine; 1: anything else (the dispatch tier); 2: ``LAST_FILES``."""
    path = nodeid.split("::", 1)[0]
    if path in LAST_FILES:
        return 2
    return 0 if path.startswith("tests/kernels/") else 1


def is_review(nodeid: str) -> bool:
    """Whether the test with pytest node id ``nodeid`` is a review check (``REVIEW_TESTS``)."""
    return nodeid.startswith(REVIEW_TESTS)


_SESSION: list[Any] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _SESSION[:] = [session]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: run_order(item.nodeid))  # stable: a file's tests keep their order


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and not is_review(report.nodeid) and _SESSION:
        _SESSION[0].shouldstop = f"moegate.power.corpus_stop: {report.nodeid} failed (a kill needs one)"
