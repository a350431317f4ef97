"""lab/gpu/gsm8k_flips.py re-judges archived GSM8K gate JSONs by the rule on main, flip by flip."""

from __future__ import annotations

import json
from pathlib import Path

from lab.gpu import gsm8k_flips

TOP = [[7, -0.1], [9, -1.0], [11, -2.0]]


def _gate(path: Path, divergences: list[dict]) -> Path:
    path.write_text(json.dumps({"summary": "FAIL (identical): ... explained (tie bound 0.5000, decode ...",
                                "differences": [{"divergences": divergences}]}))  # fmt: skip
    return path


def test_a_mirrored_flip_passes_now_and_a_disagreeing_one_stays_unexplained(tmp_path: Path, capsys) -> None:
    mirrored = {"doc_id": 1, "tokens": {"base": 7, "pr": 9}, "top": {"base": TOP, "pr": TOP}, "explained": False}
    apart = {"doc_id": 2, "tokens": {"base": 7, "pr": 9}, "explained": False,
             "top": {"base": TOP, "pr": [[9, -0.1], [7, -1.0], [11, -2.0]]}}  # fmt: skip
    assert (
        gsm8k_flips.main([str(_gate(tmp_path / "a.json", [mirrored])), str(_gate(tmp_path / "b.json", [apart]))]) == 0
    )
    rows = capsys.readouterr().out.splitlines()[2:]
    assert rows[0].endswith("| 1 | 0.5000 | 1 | 1 (1) | 0.5 | 0 | PASS |")
    assert rows[1].endswith("| 1 | 0.5000 | 1 | 0 (0) | 1 | 1 | FAIL |")


def test_a_margin_on_the_printed_bound_is_not_explained_by_its_rounding(tmp_path: Path, capsys) -> None:
    on_bound = {"doc_id": 3, "tokens": {"base": 7, "pr": 9}, "explained": False,
                "top": {"base": [[7, -0.1], [9, -0.6]], "pr": [[9, -0.1], [7, -0.6]]}}  # fmt: skip
    assert gsm8k_flips.main([str(_gate(tmp_path / "c.json", [on_bound]))]) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith("| 1 | 0.5000 | 1 | 0 (0) | 1 | 1 | FAIL |")


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    assert gsm8k_flips.main([str(tmp_path / "missing.json")]) == 2
    (tmp_path / "x.json").write_text(json.dumps({"summary": "no bound", "differences": [{"divergences": []}]}))
    assert gsm8k_flips.main([str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[1].startswith("gsm8k_flips: ") and "no tie bound" in err[1]
