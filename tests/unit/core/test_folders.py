"""moegate.core.folders.replacing: a folder is replaced whole, or left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from moegate.core.folders import replacing


def test_a_new_folder_takes_the_old_ones_place_whole(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with replacing(out) as tmp:
        assert tmp.parent == tmp_path and tmp != out
        (tmp / "new.txt").write_text("new")
        assert (out / "old.txt").is_file()  # the old folder stands until the block ends
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary or old folder left behind


def test_an_error_while_writing_leaves_the_old_folder_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="half"), replacing(out) as tmp:
        (tmp / "new.txt").write_text("new")
        raise RuntimeError("half-written")
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_folder_that_did_not_exist_appears_only_when_complete(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "model"
    with pytest.raises(ValueError), replacing(out) as tmp:
        (tmp / "a").write_text("a")
        raise ValueError
    assert not out.exists()
    with replacing(out) as tmp:
        (tmp / "a").write_text("a")
    assert (out / "a").read_text() == "a"
