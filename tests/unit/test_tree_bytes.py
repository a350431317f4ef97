"""The checkout stays small: the bytes it tracks outside ``models/`` are within ``tooling.tree_bytes.LIMIT``."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support import ROOT
from tooling import tree_bytes

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a checkout (git ls-files)"
)


def test_the_checkout_tracks_at_most_five_megabytes_outside_models():
    sizes = tree_bytes.tracked_bytes(ROOT)
    largest = ", ".join(f"{p} {s:,}" for p, s in sorted(sizes.items(), key=lambda kv: -kv[1])[:3])
    assert sum(sizes.values()) <= tree_bytes.LIMIT, f"{sum(sizes.values()):,} bytes; largest: {largest}"


def test_no_raw_archive_is_tracked_any_more():
    assert not [p for p in tree_bytes.tracked_bytes(ROOT) if p.startswith("results/raw/")]


def test_the_count_leaves_models_out_and_sees_a_new_file(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "big.bin").write_bytes(b"x" * 1000)
    (tmp_path / "a.txt").write_bytes(b"y" * 10)
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    assert tree_bytes.tracked_bytes(tmp_path) == {"a.txt": 10}
    assert tree_bytes.main(["--root", str(tmp_path), "--limit", "9"]) == 1
    assert tree_bytes.main(["--root", str(tmp_path), "--limit", "10"]) == 0


def test_a_folder_that_is_no_checkout_is_one_line_and_exit_2(tmp_path, capsys):
    assert tree_bytes.main(["--root", str(tmp_path / "nowhere")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
