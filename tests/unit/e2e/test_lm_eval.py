"""lm-eval in its own environment: a missing or wrong one is one line, a good one is asked once per process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moegate.e2e import lmeval
from moegate.e2e.lmeval import LmEvalMissing


def test_missing_lm_eval_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(LmEvalMissing) as err:
        lmeval.check_lm_eval(tmp_path / "nope" / "python")
    assert str(err.value).startswith(f"lm-eval is not installed in {tmp_path / 'nope' / 'python'}: ")
    with pytest.raises(LmEvalMissing, match="not installed in .*: "):
        lmeval.check_lm_eval(tmp_path)  # a folder that is no venv
    if _importable("lm_eval"):
        pytest.skip("lm_eval importable in this interpreter")
    with pytest.raises(LmEvalMissing) as err:
        lmeval.check_lm_eval(sys.executable)
    msg = str(err.value)
    assert msg.startswith(f"lm-eval is not installed in {sys.executable}: ") and "\n" not in msg
    assert "ModuleNotFoundError" in msg


def test_a_good_lm_eval_is_asked_once_per_interpreter_and_a_missing_one_every_time(tmp_path: Path) -> None:
    """A run starts lm-eval several times: asking its version (an import of lm-eval) once is enough."""
    from moegate.e2e.lmeval.task import LM_EVAL_VERSION

    calls = tmp_path / "calls"
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\necho x >> {calls}\necho {LM_EVAL_VERSION}\n")
    py.chmod(0o755)
    assert lmeval.check_lm_eval(py) == lmeval.check_lm_eval(py) == LM_EVAL_VERSION
    assert calls.read_text().count("x") == 1
    py.write_text(f"#!/bin/sh\necho x >> {calls}\nexit 1\n")  # another interpreter at that path (new mtime)
    for _ in range(2):
        with pytest.raises(LmEvalMissing):
            lmeval.check_lm_eval(py)
    assert calls.read_text().count("x") == 3


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
