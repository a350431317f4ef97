"""Shards of one power run join into the group's report; shards of different runs, or a shard twice, are refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from moegate.power.cli import main
from moegate.power.errors import PowerError
from moegate.power.outcome import Mutant, Outcome
from moegate.power.report import to_json
from moegate.power.shards import from_json, merge


def _shard(k: int, n: int, statuses: list[str], wall_s: float = 100.0) -> Outcome:
    mutants = [
        Mutant(id=f"m{k}-{i}", job_id=f"j{k}-{i}", file="f.py", line=10 + i, operator="op", region="r", status=st)
        for i, st in enumerate(statuses)
    ]
    return Outcome(
        vllm_version="0.33.0", package_dir="/v", command=f"power --shard {k}/{n}", test_command="pytest x",
        regions=[{"region": "r", "file": "f.py", "lines": "1-9", "why": "w"}], mutants=mutants,
        baseline={"wall_s": wall_s / 10}, wall_s=wall_s, installed_hashes={"f.py": "abc"}, installed_unchanged=True,
        stale_equivalents=["eq-a", f"eq-{k}"], groups=["kernel"], shards=[f"{k}/{n}"],
    )  # fmt: skip


def test_a_power_json_reads_back_as_the_outcome_it_was_written_from() -> None:
    o = _shard(1, 3, ["killed", "survived"])
    assert from_json(json.loads(json.dumps(to_json(o)))) == o


def test_every_shard_joins_into_one_passing_report_with_the_longest_wall() -> None:
    joined = merge([_shard(1, 2, ["killed"], wall_s=300), _shard(0, 2, ["killed", "timeout"], wall_s=200)])
    assert joined.shards == ["0/2", "1/2"] and joined.missing_shards == []
    assert len(joined.mutants) == 3 and joined.score == 1.0 and joined.passed
    assert joined.wall_s == 300 and joined.baseline == {"wall_s": 30.0}
    assert joined.stale_equivalents == ["eq-a"]  # stale only where no shard met it


def test_a_review_made_after_the_run_counts_when_the_shards_are_joined() -> None:
    shards = [_shard(0, 2, ["survived", "killed"]), _shard(1, 2, ["survived"])]
    joined = merge(shards, equivalents={"m0-0": "the kernel never reads it", "m1-0": "same", "gone": "old"})
    assert [m.status for m in joined.mutants] == ["equivalent", "killed", "equivalent"] and joined.passed
    assert joined.mutants[0].reason == "the kernel never reads it" and joined.stale_equivalents == ["gone"]
    assert shards[0].mutants[0].status == "survived"  # the shards' own outcomes are left as they were
    assert not merge(shards, equivalents={"m0-0": "only one"}).passed


def test_a_missing_shard_is_named_and_keeps_the_report_from_passing() -> None:
    joined = merge([_shard(0, 3, ["killed"]), _shard(2, 3, ["killed"])])
    assert joined.missing_shards == ["1/3"] and not joined.passed


def test_a_survivor_in_any_shard_fails_the_joined_report() -> None:
    assert not merge([_shard(0, 2, ["killed"]), _shard(1, 2, ["survived"])]).passed


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"vllm_version": "0.32.0"}, "vllm_version differs"),
        ({"installed_hashes": {"f.py": "def"}}, "installed_hashes differs"),
        ({"test_command": "pytest y"}, "test_command differs"),
        ({"shards": ["1/3"]}, "different splits"),
        ({"shards": ["0/2"]}, "given twice"),
        ({"shards": []}, "not one shard"),
    ],
)
def test_shards_of_different_runs_are_refused(change: dict[str, object], message: str) -> None:
    other = dataclasses.replace(_shard(1, 2, ["killed"]), **change)  # type: ignore[arg-type]
    with pytest.raises(PowerError, match=message):
        merge([_shard(0, 2, ["killed"]), other])


def test_a_mutant_in_two_shards_is_refused() -> None:
    twin = dataclasses.replace(_shard(1, 2, []), mutants=_shard(0, 2, ["killed"]).mutants)
    with pytest.raises(PowerError, match="m0-0 is in shards 0/2 and 1/2"):
        merge([_shard(0, 2, ["killed"]), twin])


def test_power_join_writes_the_joined_page_or_one_line_and_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dirs = []
    for k in (0, 1):
        d = tmp_path / f"s{k}"
        d.mkdir()
        (d / "power.json").write_text(json.dumps(to_json(_shard(k, 2, ["killed"]))))
        dirs.append(str(d))
    assert main(["join", *dirs, "--out", str(tmp_path / "joined"), "--command", "power-all"]) == 0
    page = (tmp_path / "joined" / "power.md").read_text()
    assert "| shards | 0/2, 1/2 |" in page and "Command: `power-all`" in page and "mutation score 100.0 %" in page
    capsys.readouterr()
    assert main(["join", dirs[0], str(tmp_path / "absent"), "--out", str(tmp_path / "half")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "absent/power.json: no power.json" in err[0]
    assert not (tmp_path / "half").exists()


def test_a_shard_cut_by_its_timeout_joins_with_its_unrun_mutants_pending_and_named_on_the_page() -> None:
    from moegate.power.report import render_markdown

    cut = dataclasses.replace(_shard(1, 2, ["killed", "pending"]), cut="cut by signal 15 while its mutants ran")
    joined = merge([_shard(0, 2, ["killed"]), cut])
    assert not joined.passed and joined.score == 1.0  # a pending mutant is not scored, and keeps the report from PASS
    assert joined.cut == "shard 1/2 cut by signal 15 while its mutants ran"
    assert "**1 not run**: shard 1/2 cut by signal 15 while its mutants ran." in render_markdown(joined)
