"""Shared fixtures, options, the report header and the tier markers for every tier."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from moegate.core import profiles
from tests.support import TIERS

PROFILE = profiles.load()

TESTS = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bless",
        action="store_true",
        default=False,
        help="rewrite golden files from this run instead of comparing (review the diff before committing)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """No test writes into a CI job's summary, and torch computes on one CPU thread in the test process.

    ``$GITHUB_STEP_SUMMARY`` is dropped for the session and every process it starts: the A/B and power command
    lines append their pages to it, and in the replayed unit job a test's stand-in A/B report appeared on the
    job's summary page (results/ci-replay.md).

    Every tier's CPU tensors are small (the unit tier's references: at most 12 experts, 9 tokens, hidden 16),
    where torch's pool of one thread per core spins between operations instead of working, and in the test
    command the spin takes the core the other lane runs on (measured: results/ci-time.md, "Less CPU work").
    Child processes (servers, builds) keep their own defaults.
    """
    os.environ.pop("GITHUB_STEP_SUMMARY", None)
    try:
        import torch
    except ImportError:  # the e2e driver's env has no torch
        return
    torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier: the directory it lives in, so no test file repeats it."""
    for item in items:
        path = item.path.resolve()
        tier = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else None
        if tier in TIERS:
            item.add_marker(tier)


VLLM_FIXTURES = frozenset({"target", "cuda_target"})
"""The fixtures that attach the installed vLLM: a test that uses one is a test of a vLLM tier."""


def require_vllm() -> bool:
    """A vLLM tier whose vLLM does not import fails, unless ``MOEGATE_REQUIRE_VLLM=0`` asks for skips instead."""
    return os.environ.get("MOEGATE_REQUIRE_VLLM", "1").strip() != "0"


def vllm_import_error() -> str | None:
    """Why ``import vllm`` fails here, or None (``moegate.builds.probe.import_error``: vLLM is imported in moegate/builds/)."""
    from moegate.builds.probe import import_error

    return import_error()


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run that selected tests of a vLLM tier, where vLLM does not import, stops at once with one line and exit 1.

    Without this, ``pytest tests/dispatch`` in an environment without vLLM skipped every test and exited 0: a gate
    that passes on nothing. ``MOEGATE_REQUIRE_VLLM=0`` keeps the old skips (with their reason) for a deliberate run
    of the whole tree in an environment without vLLM; ``--collect-only`` is never stopped."""
    if session.config.option.collectonly or not require_vllm():
        return
    needing = [item for item in session.items if VLLM_FIXTURES & set(getattr(item, "fixturenames", ()))]
    if not needing:
        return
    error = vllm_import_error()
    if error is not None:
        pytest.exit(
            f"moegate: {len(needing)} selected tests need vLLM, and it does not import in {sys.executable}: {error} "
            "(MOEGATE_REQUIRE_VLLM=0 skips them instead)",
            returncode=1,
        )


def pytest_report_header(config: pytest.Config) -> list[str]:
    try:
        from moegate.dispatch.environment import describe_environment
    except ImportError as exc:  # the e2e driver's env has no torch: its servers run in the builds' envs
        env = {"torch": f"absent ({exc.name})"}
    else:
        env = describe_environment()
    env["hypothesis_profile"] = PROFILE
    return ["moegate environment: " + ", ".join(f"{k}={v}" for k, v in env.items())]


@pytest.fixture(scope="session")
def bless(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--bless"))


def _attach(finish: bool) -> Iterator[object]:
    from moegate.dispatch.names import TargetError
    from moegate.dispatch.target import VllmTarget
    from moegate.kernels.inputs import WeightBank

    try:
        t = VllmTarget(finish=finish, weights=WeightBank)
    except TargetError as exc:
        if require_vllm():
            pytest.fail(f"{exc} (MOEGATE_REQUIRE_VLLM=0 skips instead)", pytrace=False)
        pytest.skip(str(exc))
    if finish and not t.uva_available():
        t.close()
        pytest.skip("needs UVA (pinned host memory the GPU reads in place); vLLM reports it unavailable here")
    try:
        yield t
    finally:
        t.close()


@pytest.fixture(scope="session")
def target() -> Iterator[object]:
    """The installed vLLM, instrumented; calls stop right after the path decision, on a CPU or a GPU.

    Fails without an importable vLLM (skips under MOEGATE_REQUIRE_VLLM=0).
    """
    yield from _attach(finish=False)


@pytest.fixture(scope="session")
def cuda_target() -> Iterator[object]:
    """The installed vLLM with calls run to the end on the GPU: outputs, real UVA weights."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: kernel outputs and UVA host-resident weights cannot be produced on a CPU")
    yield from _attach(finish=True)
