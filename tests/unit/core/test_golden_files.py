"""Golden tooling: compare, .obtained on mismatch, change only on bless, never half-written."""

from __future__ import annotations

from pathlib import Path

import pytest

from moegate.core import golden_files


def test_missing_golden_fails_and_leaves_obtained(tmp_path: Path):
    with pytest.raises(golden_files.GoldenMissing, match="missing"):
        golden_files.check("t.tsv", "a\n", directory=tmp_path)
    assert (tmp_path / "t.tsv.obtained").read_text() == "a\n"
    assert not (tmp_path / "t.tsv").exists()


def test_bless_writes_and_match_passes(tmp_path: Path):
    golden_files.check("t.tsv", "# date: x\na\n", directory=tmp_path, bless=True)
    golden_files.check("t.tsv", "# date: y\na\n", directory=tmp_path)  # provenance lines are not compared
    assert not (tmp_path / "t.tsv.obtained").exists()


def test_mismatch_fails_with_diff_and_keeps_golden(tmp_path: Path):
    golden_files.check("t.tsv", "a\nb\n", directory=tmp_path, bless=True)
    with pytest.raises(golden_files.GoldenMismatch) as err:
        golden_files.check("t.tsv", "a\nc\n", directory=tmp_path)
    assert "-b" in str(err.value) and "+c" in str(err.value) and "nox -s bless" in str(err.value)
    assert (tmp_path / "t.tsv").read_text() == "a\nb\n"
    assert (tmp_path / "t.tsv.obtained").read_text() == "a\nc\n"


def test_a_mismatch_in_a_run_with_its_own_obtained_dir_leaves_the_one_beside_the_golden_alone(tmp_path, monkeypatch):
    """The meta-check's base run writes its obtained files apart, so a passing run beside it cannot remove them."""
    golden_files.check("t.tsv", "a\nb\n", directory=tmp_path, bless=True)
    (tmp_path / "t.tsv.obtained").write_text("another run's\n")
    monkeypatch.setenv("MOEGATE_OBTAINED_DIR", str(tmp_path / "own"))
    (tmp_path / "own").mkdir()
    with pytest.raises(golden_files.GoldenMismatch, match="own/t.tsv.obtained"):
        golden_files.check("t.tsv", "a\nc\n", directory=tmp_path)
    assert (tmp_path / "own" / "t.tsv.obtained").read_text() == "a\nc\n"
    assert (tmp_path / "t.tsv.obtained").read_text() == "another run's\n"


def test_atomic_write_leaves_old_file_when_writing_fails(tmp_path: Path):
    target = tmp_path / "g.tsv"
    target.write_text("old\n")

    class Boom:
        def __str__(self) -> str:
            raise RuntimeError("boom")

    with pytest.raises(TypeError):
        golden_files.atomic_write(target, Boom())  # type: ignore[arg-type]
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["g.tsv"]


def test_provenance_header_lines_are_comments():
    h = golden_files.provenance_header({"vllm": "0.33.0"})
    assert all(line.startswith("# ") for line in h.splitlines())
    assert golden_files.body(h + "x\n") == "x\n"
