"""lab/gpu/compact_run.py: a run's per-token numbers kept in one small file, read back the same, and a folder that
is not a run refused in one line with nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lab.gpu.compact_run import main
from moegate.e2e.greedy_passes import Completion
from moegate.e2e.run_data import BuildRun, ScoreData, write_raw, write_scores
from moegate.e2e.teacher_forced import COMPOSITIONS, Scored, TokenSeq
from moegate.serve.build import Build


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for label, lp in (("base", -0.5), ("pr", -0.625)):
        b = BuildRun(Build(label, "(raw)"))
        b.greedy = {1: [Completion("p0", "h", [7, 8], [[(7, lp), (3, -2.0)], [(8, -0.25), (9, -0.5)]])]}
        b.repeat = {4: [Completion("p0", "h", [7], [[(7, lp)]])]}
        write_raw(b, run)
    data = ScoreData(("base", "pr"), sequences=[TokenSeq("s0", (1, 2, 3), 1), TokenSeq("s0+pr", (1, 2, 4), 1)])
    data.compositions = list(COMPOSITIONS)
    both = {"s0": Scored("s0", [-1.0, -2.0], [1, 2], [[(2, -1.0)], [(5, -1.5), (3, -2.0)]]),
            "s0+pr": Scored("s0+pr", [-1.0, -3.0], [1, None], [])}  # fmt: skip
    data.scores = {"base": [both, both], "pr": [both, both], "ref": [{"s0": both["s0"]}]}
    write_scores(data, run)
    return run


def test_a_runs_per_token_numbers_are_kept_and_read_back(tmp_path: Path) -> None:
    out = tmp_path / "compact.npz"
    assert main([str(_run(tmp_path)), str(out)]) == 0
    z = np.load(out, allow_pickle=False)  # no pickle: plain arrays only
    assert z["greedy/base/1/token"].tolist() == [7, 8]
    assert z["greedy/pr/1/logprob"].tolist() == [-0.625, -0.25]
    assert z["greedy/base/1/second"].tolist() == [-2.0, -0.5] and z["greedy/base/1/offsets"].tolist() == [0, 2]
    assert z["greedy/pr/repeat-4/logprob"].tolist() == [-0.625] and np.isnan(z["greedy/pr/repeat-4/second"][0])
    assert z["scored/pr/1/seq_ids"].tolist() == ["s0", "s0+pr"] and z["scored/pr/1/offsets"].tolist() == [0, 2, 4]
    assert z["scored/base/0/logprob"].tolist() == [-1.0, -2.0, -1.0, -3.0]
    assert z["scored/base/0/rank"].tolist() == [1, 2, 1, -1]
    assert z["scored/ref/0/seq_ids"].tolist() == ["s0"]  # the reference scores the base's sequences only


def test_a_folder_that_is_no_run_is_one_line_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "compact.npz"
    assert main([str(tmp_path), str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not an e2e run's raw folder" in err[0] and not out.exists()
