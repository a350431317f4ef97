"""Tier markers come from the directory a test lives in (``tests/conftest.py``), and match pyproject's list; the
session set-up every tier shares."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib

import pytest

from tests.support import ROOT, TIERS


def test_a_unit_test_carries_the_unit_marker_and_no_other_tier(request: pytest.FixtureRequest) -> None:
    tiers = {m.name for m in request.node.iter_markers() if m.name in TIERS}
    assert tiers == {"unit"}


def test_every_tier_directory_is_a_registered_marker_and_back() -> None:
    declared = {
        line.split(":", 1)[0]
        for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    }
    dirs = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    assert set(TIERS) == declared == dirs


def test_selecting_by_marker_selects_by_directory() -> None:
    """``-m kernels`` collects exactly the tests under tests/kernels/ (collection only: nothing runs).

    From every tier's directory but the unit tier's rooms other than ``tests/unit/kernels/``, the one whose path names
    a tier it is not: the unit tier's other 1,300 tests took 4 of the 9 s of CPU that collecting ``tests`` took."""
    where = [f"tests/{tier}" for tier in TIERS if tier != "unit"] + ["tests/unit/kernels"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "kernels", *where],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    ).stdout  # fmt: skip
    ids = [line for line in out.splitlines() if "::" in line]
    assert ids and all(i.startswith("tests/kernels/") for i in ids), out[-2000:]
    assert re.search(r"\(\d+ deselected\)", out), out[-2000:]  # tests/unit/kernels/ was collected, and left out


def test_a_test_session_leaves_the_ci_jobs_summary_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command lines tests run append pages to ``$GITHUB_STEP_SUMMARY``; the session drops it for every process."""
    import tests.conftest

    monkeypatch.setenv("GITHUB_STEP_SUMMARY", "/tmp/the-jobs-summary.md")
    tests.conftest.pytest_configure(pytest.Config.__new__(pytest.Config))
    assert "GITHUB_STEP_SUMMARY" not in os.environ


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="shows the stop where vLLM is absent")
def test_a_vllm_tier_run_where_vllm_does_not_import_stops_in_one_line_and_fails() -> None:
    """``pytest tests/dispatch`` in an environment without vLLM used to skip every test and exit 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/dispatch/test_adapter.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env={k: v for k, v in os.environ.items() if k != "MOEGATE_REQUIRE_VLLM"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if "need vLLM" in ln]
    assert f"selected tests need vLLM, and it does not import in {sys.executable}: ModuleNotFoundError" in line
    assert "(MOEGATE_REQUIRE_VLLM=0 skips them instead)" in line and " passed" not in proc.stdout


def test_moegate_require_vllm_0_keeps_the_skips_and_collection_is_never_stopped(monkeypatch) -> None:
    from types import SimpleNamespace

    import tests.conftest

    option = SimpleNamespace(collectonly=False)
    session = SimpleNamespace(items=[SimpleNamespace(fixturenames=("target",))], config=SimpleNamespace(option=option))

    monkeypatch.setattr(tests.conftest, "vllm_import_error", lambda: "ModuleNotFoundError: No module named 'vllm'")
    monkeypatch.setenv("MOEGATE_REQUIRE_VLLM", "0")
    tests.conftest.pytest_collection_finish(session)  # type: ignore[arg-type]
    monkeypatch.setenv("MOEGATE_REQUIRE_VLLM", "1")
    with pytest.raises(pytest.exit.Exception, match="1 selected tests need vLLM"):
        tests.conftest.pytest_collection_finish(session)  # type: ignore[arg-type]
    option.collectonly = True
    tests.conftest.pytest_collection_finish(session)  # type: ignore[arg-type]
