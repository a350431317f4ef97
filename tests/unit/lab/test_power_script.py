"""lab/gpu/power.sh, the GPU power run as one script of a wave: bad input is one line and exit 2, before anything runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT

SCRIPT = ROOT / "lab" / "gpu" / "power.sh"


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        ([], {}, "usage: bash lab/gpu/power.sh RESULT_DIR"),
        (["OUT"], {"BUDGET_S": "60"}, "BUDGET_S is whole seconds, at least 300"),
        (["OUT"], {"BUDGET_S": "900"}, "no cosmic-ray in POWER_SITE="),
    ],
    ids=["no-dir", "budget-too-small", "no-cosmic-ray"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], env: dict[str, str], says: str) -> None:
    argv = [str(tmp_path / a) for a in args]
    full_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env}
    proc = subprocess.run(
        ["bash", str(SCRIPT), *argv], cwd=ROOT, env=full_env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and says in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not (tmp_path / "OUT").exists()  # nothing written
