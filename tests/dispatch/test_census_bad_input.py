"""A vLLM the census cannot read: one line naming what it looked for and where, exit 2, nothing written.

Each test mutilates a copy of the installed vLLM's source the way a release could
break the census, runs ``python -m moegate.census --out FILE`` on it in-process,
and puts the copy back. The copy is a tree of real folders whose ``.py`` and tuned-config
files are symbolic links to the installed ones (a second; copying 4,000 files takes
ten), and a file is made a real file of its own before it is changed, so nothing is
ever written through a link into the installed vLLM.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from moegate.census import __main__ as cli
from moegate.census import census
from moegate.census.builders import LAYER_MODULE
from moegate.census.sites import DECISION, DEFINED_IN
from moegate.census.source import locate
from moegate.census.tuned import CONFIGS_DIR


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the installed vLLM's Python files and tuned configs."""
    src = locate()
    dest = tmp_path_factory.mktemp("vllm-copy") / "vllm"

    def ignore(folder: str, entries: list[str]) -> set[str]:
        keep = {e for e in entries if e.endswith((".py", ".json")) or (Path(folder) / e).is_dir()}
        return set(entries) - keep | {"__pycache__"}

    shutil.copytree(src.root, dest, ignore=ignore, copy_function=os.symlink)
    return dest


def _own(path: Path) -> None:
    """Make ``path`` a real file holding what its link points to."""
    if path.is_symlink():
        data = path.read_bytes()
        path.unlink()
        path.write_bytes(data)


@pytest.fixture
def mutilate(tree: Path) -> Iterator[Callable[[str, Callable[[Path], None]], None]]:
    """``mutilate(rel, change)``: apply ``change`` to ``tree/rel``; put it back after the test."""
    saved: list[tuple[Path, Path]] = []

    def apply(rel: str, change: Callable[[Path], None]) -> None:
        target = tree / rel
        backup = tree.parent / (target.name + ".orig")
        if target.is_dir():
            shutil.copytree(target, backup, symlinks=True)
        else:
            _own(target)
            shutil.copy2(target, backup)
        saved.append((target, backup))
        change(target)

    yield apply
    for target, backup in reversed(saved):
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        backup.rename(target)


def _run(tree: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, Path]:
    out = tmp_path / "census.jsonl"
    rc = cli.main(["--vllm-root", str(tree), "--out", str(out)])
    return rc, capsys.readouterr().err, out


def _replace(old: str, new: str) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        assert not path.is_symlink(), f"{path} is a link into the installed vLLM: not written"
        text = path.read_text()
        assert old in text, f"{old!r} not in {path}: the test no longer mutilates what it says"
        path.write_text(text.replace(old, new))

    return change


def _assert_one_line(rc: int, err: str, out: Path, *needles: str) -> None:
    assert rc == 2, f"exit {rc}: {err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got: {err}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not named in: {lines[0]}"
    assert not out.exists(), "the census wrote a file for a vLLM it could not read"


def test_a_renamed_layer_builder_names_the_builder_and_the_files_searched(tree, mutilate, tmp_path, capsys):
    """The layer module still builds a layer, under a name no model calls: nothing to count."""
    mutilate(LAYER_MODULE, _replace("def FusedMoEFactory(", "def FusedMoEBuilder("))
    rc, err, out = _run(tree, tmp_path, capsys)
    _assert_one_line(rc, err, out, "FusedMoEBuilder", str(tree))


def test_a_builder_without_the_shape_parameters_names_the_layer_module(tree, mutilate, tmp_path, capsys):
    mutilate(LAYER_MODULE, _replace("    num_experts: int,  # Global number of experts", "    n_experts: int,"))
    rc, err, out = _run(tree, tmp_path, capsys)
    _assert_one_line(rc, err, out, "num_experts", str(tree / LAYER_MODULE))


def test_a_missing_layer_module_names_its_path(tree, mutilate, tmp_path, capsys):
    mutilate(LAYER_MODULE, lambda p: p.unlink())
    rc, err, out = _run(tree, tmp_path, capsys)
    _assert_one_line(rc, err, out, str(tree / LAYER_MODULE))


def test_a_missing_configs_folder_names_the_folder(tree, mutilate, tmp_path, capsys):
    mutilate(CONFIGS_DIR, shutil.rmtree)
    rc, err, out = _run(tree, tmp_path, capsys)
    _assert_one_line(rc, err, out, str(tree / CONFIGS_DIR))


def test_an_empty_configs_folder_names_the_folder_and_the_names_looked_for(tree, mutilate, tmp_path, capsys):
    def empty(folder: Path) -> None:
        for f in folder.glob("*.json"):
            f.unlink()

    mutilate(CONFIGS_DIR, empty)
    rc, err, out = _run(tree, tmp_path, capsys)
    _assert_one_line(rc, err, out, str(tree / CONFIGS_DIR), "E=<experts>")


def test_a_renamed_decision_names_the_decision_and_its_module(tree, mutilate, tmp_path, capsys):
    mutilate(DEFINED_IN[DECISION], _replace(f"def {DECISION}(", "def _assign_experts("))
    rc, err, out = _run(tree, tmp_path, capsys)
    _assert_one_line(rc, err, out, DECISION, str(tree / DEFINED_IN[DECISION]))


def test_the_unharmed_copy_passes_what_the_harms_trip_so_the_failures_are_the_harms(tree):
    """Every check the harms above trip, on the copy as it is (the whole census of the same files is
    ``test_census.py``'s, on the installed tree: not taken twice)."""
    src = locate(tree)
    files, found, (tuned_records, _), dtypes, activations, params = census.preflight(src)
    assert [b.name for b in found] == ["FusedMoEFactory"] and tuned_records and dtypes and activations
    assert DECISION in params and len(files) > 1000
    callers = [f for f in files if "FusedMoEFactory(" in f.read_text()]
    assert len(callers) > 20, "the copy's model files call the builder (the renamed-builder harm hides them)"
