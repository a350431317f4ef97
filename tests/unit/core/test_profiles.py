"""The Hypothesis profiles set the example count of every tier, the kernel tier's included."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from moegate.core import profiles
from tests.support import ROOT


def test_every_profile_has_a_kernel_tier_count_and_nightly_scales_it():
    assert set(profiles.KERNEL_EXAMPLES) == set(profiles.KNOWN)
    assert profiles.kernel_examples("nightly") > profiles.kernel_examples("ci")


@pytest.mark.parametrize("name", ["ci", "nightly"])
def test_the_kernel_tier_takes_its_count_from_the_selected_profile(name):
    """What tests/kernels runs with, read in a fresh process under MOEGATE_PROFILE (no other knob)."""
    proc = subprocess.run(
        [sys.executable, "-c", "from tests.support.kernels import kernel_settings as s; print(s.max_examples)"],
        cwd=ROOT, env={**os.environ, "MOEGATE_PROFILE": name},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) == profiles.KERNEL_EXAMPLES[name]


def test_an_unknown_profile_is_one_line(monkeypatch):
    monkeypatch.setenv(profiles.PROFILE_ENV, "weekly")
    with pytest.raises(SystemExit, match="unknown Hypothesis profile 'weekly'"):
        profiles.kernel_examples()
