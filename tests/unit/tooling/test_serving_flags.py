"""The servers' flags are written in one place (``tooling/serving.py``): every session, leg, benchmark and GPU-machine
script takes them from there, and a shell script prints them with ``python -m tooling.serving``."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT
from tooling import serving

SPELLED = "--max-model-len 4096"
"""The flag every server of the project starts with: where it is written out, a set of flags is."""


def test_no_file_but_tooling_serving_writes_the_server_flags_out():
    out = subprocess.run(
        ["git", "grep", "-l", "-F", "-e", SPELLED, "--", "*.py", "*.sh", "*.yml", "*.yaml", "*.toml", "noxfile.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert [p for p in out if not p.startswith("tests/")] == ["tooling/serving.py"]


def test_the_command_line_prints_what_the_sessions_use():
    def flags(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "tooling.serving", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    assert flags("--cpu") == serving.CPU_SERVER_ARGS
    assert flags("--gpu") == serving.GPU_SERVER_ARGS
    assert flags("--gpu", "--graphs").split() == [f for f in serving.GPU_SERVER_ARGS.split() if f != "--enforce-eager"]
    assert "--max-num-seqs 16" in flags("--base-only", "--concurrency", "1,16")
    assert flags("--base-only", "--uva").endswith(serving.UVA_EXPERTS)


def test_the_flag_order_the_e2e_goldens_are_keyed_by_is_kept():
    """The e2e goldens' names carry a hash of the server flags: the composed strings are the ones they were blessed
    under (moegate/e2e/golden_records.py)."""
    assert serving.CPU_SERVER_ARGS == (
        "--max-model-len 4096 --enforce-eager --dtype bfloat16 --max-num-seqs 4 --no-enable-prefix-caching"
        " --gpu-memory-utilization 0.2"
    )
