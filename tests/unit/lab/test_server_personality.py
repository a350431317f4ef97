"""lab/gpu/server_personality.py: where two greedy passes part, within a server and between a pair's servers, and the
servers of many pairs grouped into classes of bit-identical output; a folder without its files refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lab.gpu.server_personality import classes, main, pair_row

PROMPTS = ("p0", "p1", "p2")
BASE = {p: (np.arange(8, dtype=np.int32), -np.linspace(0.1, 0.8, 8).astype(np.float32)) for p in PROMPTS}


def _moved(step: int, prompt: str = "p1") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The base passes with one prompt's log-probability moved from ``step`` on (a start's kernel choice)."""
    out = {p: (t.copy(), lp.copy()) for p, (t, lp) in BASE.items()}
    out[prompt][1][step:] += np.float32(1e-3)
    return out


def _pair(d: Path, passes: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]], base: str, pr: str) -> Path:
    arrays: dict[str, Any] = {}
    for key, per in passes.items():
        ids = list(per)
        arrays[f"greedy/{key}/token"] = np.concatenate([per[p][0] for p in ids])
        arrays[f"greedy/{key}/logprob"] = np.concatenate([per[p][1] for p in ids])
        arrays[f"greedy/{key}/offsets"] = np.cumsum([0] + [per[p][0].size for p in ids]).astype(np.int64)
        arrays[f"greedy/{key}/prompt_ids"] = np.array(ids)
    d.mkdir(parents=True)
    np.savez(d / "compact.npz", **arrays)
    (d / "wall.txt").write_text(f"exit 1 wall_ms 1 base {base} pr {pr} model trained gates greedy promise identical\n")
    return d


def _same_build(d: Path, base_passes: dict, pr_passes: dict, base: str = "033", pr: str = "033") -> Path:
    return _pair(d, {"base/1": base_passes, "base/4": base_passes, "base/repeat-4": _moved(1, "p0"),
                     "pr/1": pr_passes, "pr/4": pr_passes, "pr/repeat-4": pr_passes}, base, pr)  # fmt: skip


def test_two_servers_that_part_at_the_same_late_step_at_1_and_4_in_flight_are_told_from_a_repeat(tmp_path):
    row = pair_row(_same_build(tmp_path / "s", BASE, _moved(5)) / "compact.npz")
    assert row["base 4 / repeat"] == (3, {"p0": 1})  # the batch moves the first decode step only
    assert row["pr 4 / repeat"] == (3, {})
    assert row["base / pr at 1"] == (3, {"p1": 5}) and row["base / pr at 4"] == (3, {"p1": 5})
    assert row["same at 1 and 4"] == 1


def test_a_difference_in_tokens_or_length_counts_as_parting(tmp_path):
    shorter = {p: (t[:6], lp[:6]) for p, (t, lp) in BASE.items()}
    other = {p: (t.copy(), lp.copy()) for p, (t, lp) in BASE.items()}
    other["p2"][0][3] = 99
    row = pair_row(_pair(tmp_path / "s", {"base/1": BASE, "base/4": BASE, "base/repeat-4": BASE, "pr/1": shorter,
                                          "pr/4": other, "pr/repeat-4": other}, "033", "033") / "compact.npz")  # fmt: skip
    assert row["base / pr at 1"] == (3, {"p0": 6, "p1": 6, "p2": 6})
    assert row["base / pr at 4"] == (3, {"p2": 3})


def test_servers_of_many_pairs_fall_into_classes_and_another_build_lands_in_one(tmp_path):
    dirs = [_same_build(tmp_path / "a", BASE, BASE), _same_build(tmp_path / "b", BASE, _moved(5)),
            _same_build(tmp_path / "c", _moved(5), BASE, base="032")]  # fmt: skip
    got = classes(dirs)["trained"]
    assert got == [["a:base", "a:pr", "b:base", "c:pr"], ["b:pr", "c:base"]]


def test_a_folder_without_its_files_is_refused_in_one_line(tmp_path, capsys):
    d = _same_build(tmp_path / "a", BASE, BASE)
    (d / "wall.txt").unlink()
    assert main([str(d)]) == 0  # the per-pair table reads compact.npz alone
    capsys.readouterr()
    assert main(["--classes", str(d)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no wall.txt" in err
    assert main([]) == 2


def test_the_greedy_cut_for_a_committed_archive_gives_the_same_classes(tmp_path):
    dirs = [_same_build(tmp_path / "a", BASE, BASE), _same_build(tmp_path / "b", BASE, _moved(5))]
    full = classes(dirs)
    assert main(["--cut", *map(str, dirs)]) == 0
    for d in dirs:
        (d / "compact.npz").rename(d / "kept.npz")
        assert (d / "greedy.npz").is_file()
    assert classes(dirs) == full
    assert main(["--cut", str(dirs[0])]) == 2  # nothing to cut from


def test_two_sessions_folders_of_one_name_stay_apart_and_an_unknown_option_is_one_line(tmp_path, capsys):
    dirs = [_same_build(tmp_path / "one" / "s", BASE, BASE), _same_build(tmp_path / "two" / "s", BASE, _moved(5))]
    assert classes(dirs)["trained"] == [["one/s:base", "one/s:pr", "two/s:base"], ["two/s:pr"]]
    assert main(["--clases", str(dirs[0])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--clases" in err
