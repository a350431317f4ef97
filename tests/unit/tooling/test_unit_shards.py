"""The unit tier's two shards (tooling/unit_shards.py): together they run every test of the tier, each exactly once."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import PurePosixPath

import pytest

from tests.support import ROOT
from tooling import unit_shards


def _selected(args: list[str], files: list[str]) -> set[str]:
    """The test files pytest collects from ``args``: under a path given, and under no ``--ignore``'d one."""
    given = [PurePosixPath(a) for a in args if not a.startswith("--")]
    ignored = [PurePosixPath(a.removeprefix("--ignore=")) for a in args if a.startswith("--ignore=")]
    return {
        f
        for f in files
        if any(PurePosixPath(f).is_relative_to(g) for g in given)
        and not any(PurePosixPath(f).is_relative_to(i) for i in ignored)
    }


def test_the_two_shards_run_every_test_file_of_the_unit_tier_exactly_once():
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / unit_shards.TIER).rglob("test_*.py"))
    shards = [_selected(unit_shards.pytest_args(k), files) for k in unit_shards.SHARDS]
    assert all(shards), "a shard with no test files"
    assert sorted(f for shard in shards for f in shard) == files


def test_every_room_of_shard_one_exists_and_holds_tests():
    for room in unit_shards.SHARD_1:
        assert any((ROOT / unit_shards.TIER / room).rglob("test_*.py")), room


def test_an_unknown_shard_is_refused_by_name():
    with pytest.raises(ValueError, match="no unit shard 3: the shards are 1, 2"):
        unit_shards.pytest_args(3)


@pytest.mark.skipif(importlib.util.find_spec("nox") is None, reason="nox is not installed here (pip install nox)")
def test_the_test_command_runs_the_shards_and_not_the_whole_tier_again():
    cmd = [sys.executable, "-m", "nox", "-l", "--json", "-t", "tests"]
    listed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    names = [entry["session"] for entry in json.loads(listed.stdout)]
    assert [n for n in names if n.startswith("unit")] == ["unit-shard(1)", "unit-shard(2)"]
