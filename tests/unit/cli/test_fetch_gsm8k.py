"""``moegate fetch-gsm8k`` against a local ``file://`` copy of the authors' files (this machine cannot reach GitHub's
raw host; the command reads any URL urllib does): the published files are fetched and checked, a corrupt one is
refused in one line and leaves nothing behind, files already there are kept."""

from __future__ import annotations

import shutil

import pytest

from moegate.cli import fetch_gsm8k
from moegate.e2e.gsm8k_files import GSM8K_SHA256, gsm8k_dir

PUBLISHED = gsm8k_dir()
pytestmark = pytest.mark.skipif(
    not all((PUBLISHED / n).is_file() for n in GSM8K_SHA256),
    reason=f"needs GSM8K's published files in {PUBLISHED} ($MOEGATE_GSM8K_DIR, or moegate fetch-gsm8k's folder)",
)


def test_the_published_files_are_fetched_checked_and_pointed_at(tmp_path, capsys):
    dest = tmp_path / "gsm8k"
    assert fetch_gsm8k.main(["--dir", str(dest), "--source", PUBLISHED.as_uri()]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"export MOEGATE_GSM8K_DIR={dest}"
    assert sorted(p.name for p in dest.iterdir()) == ["test.jsonl", "train.jsonl"]  # and no temporary folder left
    assert all(line.endswith("sha256 as published") for line in out[:-1])
    assert fetch_gsm8k.main(["--dir", str(dest), "--source", (tmp_path / "nowhere").as_uri()]) == 0  # kept: no fetch
    assert "already there" in capsys.readouterr().out


def test_a_corrupt_download_is_one_line_exit_1_and_nothing_is_written(tmp_path, capsys):
    source = tmp_path / "mirror"
    source.mkdir()
    shutil.copy(PUBLISHED / "test.jsonl", source / "test.jsonl")
    data = (PUBLISHED / "train.jsonl").read_bytes()
    (source / "train.jsonl").write_bytes(data[:-200])  # truncated in transit
    dest = tmp_path / "gsm8k"
    assert fetch_gsm8k.main(["--dir", str(dest), "--source", source.as_uri()]) == 1
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(f"moegate fetch-gsm8k: GSM8K: {source.as_uri()}/train.jsonl has sha256 ")
    assert err.endswith(f"expected {GSM8K_SHA256['train.jsonl']}: not the published file")
    assert list(dest.iterdir()) == []  # not even the good test.jsonl: the folder is whole or untouched


def test_a_source_that_does_not_answer_is_one_line(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert fetch_gsm8k.main(["--dir", str(tmp_path / "g"), "--source", missing.as_uri()]) == 1
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(f"moegate fetch-gsm8k: GSM8K: could not download {missing.as_uri()}/test.jsonl")
