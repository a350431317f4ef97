"""Bad input gets one clear line and a non-zero exit (or an explicit skip), never a silent pass."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import types

import pytest

from moegate.core.case import MoECase
from moegate.dispatch import names
from moegate.dispatch.names import TargetError
from moegate.dispatch.target import VllmTarget
from tests.support import ROOT


def test_missing_vllm_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(TargetError, match=r"vLLM is not importable here.*`nox -s dispatch-0\.33\.0`"):
        VllmTarget()


def test_vllm_without_the_entrypoints_names_what_is_missing(monkeypatch):
    fake = types.ModuleType("vllm")
    monkeypatch.setattr(fake, "__version__", "0.1.0", raising=False)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    for name in (names.FUSED_MOE, names.TRITON_MOE, names.FUSED_MOE_PKG):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    with pytest.raises(TargetError) as err:
        VllmTarget()
    msg = str(err.value)
    assert "vLLM 0.1.0 lacks" in msg and "fused_experts_impl" in msg and "TritonExperts" in msg
    assert "\n" not in msg


def test_unknown_entrypoint_is_refused_before_running():
    target = object.__new__(VllmTarget)  # no vLLM needed: the check comes first
    with pytest.raises(ValueError, match="unknown entrypoint 'marlin'"):
        VllmTarget.run(target, MoECase(num_tokens=1, top_k=1, num_experts=8), "marlin")


def test_cli_refuses_a_non_case_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "moegate", "spec", "{not json"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().startswith("moegate: not a case:") and proc.stderr.strip().count("\n") == 0


@pytest.mark.skipif(shutil.which("nox") is None, reason="nox is not installed in this environment (pip install nox)")
def test_unknown_nox_argument_is_one_clear_error():
    proc = subprocess.run(
        ["nox", "-s", "lint", "--", "--frobnicate"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode != 0
    assert "unknown argument '--frobnicate' for session lint" in proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("nox") is None, reason="nox is not installed in this environment (pip install nox)")
def test_a_pytest_session_hands_other_arguments_to_pytest():
    """`nox -s "unit(3.X)" -- FILE -k ... --co -q` reaches pytest (collect only: no test runs twice), and a path
    among the args is what it collects, not the whole tier beside it (which took 44 s to collect here).

    The session of this Python only: its environment is the one running this test.
    """
    session = f"unit({sys.version_info.major}.{sys.version_info.minor})"
    proc = subprocess.run(
        ["nox", "-s", session, "--", "tests/unit/e2e/test_greedy.py", "-k", "test_first_divergence", "--co", "-q"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-2000:]
    assert "test_first_divergence_is_the_first_position_that_differs" in out
    counts = re.search(r"(\d+)/(\d+) tests? collected", out)
    assert counts is not None, out[-2000:]
    assert 0 < int(counts[1]) < int(counts[2]) < 100  # -k chose among that file's tests, not the tier's thousand


def test_observation_names_inconsistent_evidence():
    from moegate.dispatch.recorders import Launch, Observation

    def launches(*naive: bool) -> list[Launch]:
        return [Launch(naive=n, weight_host=False, rows=2, top_k=2, experts=64) for n in naive]

    assert Observation("legacy").path == "no-kernel-launch"
    assert Observation("legacy", align_calls=0, launches=launches(True, True)).path == "naive"
    assert Observation("legacy", align_calls=1, launches=launches(False, False)).path == "sorted"
    # alignment ran but the kernel still got sorted_token_ids=None: neither path
    assert Observation("legacy", align_calls=1, launches=launches(True)).path.startswith("inconsistent")
    assert Observation("legacy", align_calls=0, launches=launches(False)).path.startswith("inconsistent")
