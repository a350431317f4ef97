"""lab/gpu/faults.sh, the device run of runner faults: where it cannot run it says why in one line, exits 2 and
writes nothing (what it does on a GPU is its header's; its mechanics were rehearsed on the CPU with TIERS=dispatch)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import ROOT

SCRIPT = ROOT / "lab" / "gpu" / "faults.sh"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({}, "faults.sh: no nvidia-smi here: the kernels tier needs a GPU (TIERS=dispatch HOG=0 rehearses on a CPU)"),
        ({"TIERS": "dispatch", "SITE": "/nonexistent/site"}, "faults.sh: no vLLM site at /nonexistent/site"),
    ],
    ids=["no GPU", "no vLLM site"],
)
def test_a_machine_it_cannot_run_on_gets_one_line_exit_2_and_nothing_written(tmp_path, env, says):
    path = "/usr/bin:/bin"  # no nvidia-smi there on this machine (nor on any without a driver)
    if "no nvidia-smi" in says and any(Path(d, "nvidia-smi").exists() for d in path.split(":")):
        pytest.skip("this machine has nvidia-smi in /usr/bin or /bin: the no-GPU line cannot be shown here")
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "rd")], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**{k: v for k, v in os.environ.items() if k not in ("TIERS", "SITE")}, "PATH": path,
             "HOME": str(tmp_path), **env},
    )  # fmt: skip
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(says) and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []
