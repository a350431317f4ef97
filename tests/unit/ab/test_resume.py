"""A/B runs that span several sessions of a lent machine: ``--resume`` keeps the schedule, may grow
it by whole rounds, and refuses to mix in another experiment (plan, builds, flags or model)."""

from __future__ import annotations

import json

import pytest

from moegate.ab import report
from moegate.ab.plan import Dataset, DriverError, load_run, schedule
from moegate.ab.verdict import compare
from moegate.core.hashing import model_hash
from moegate.model.tiny_spec import BUILD_INFO
from tests.support.ab import StubBench, StubServer, make_driver, reset_stubs, tok_s  # noqa: F401 (autouse)


def _resumed(tmp_path, bench, **kw):
    d = make_driver(tmp_path, bench, **kw)
    d.resume = True
    return d


def test_a_resumed_run_continues_the_same_schedule_and_keeps_the_first_sizing(tmp_path):
    """A long schedule split over two sessions equals the one-go run's order."""
    bench = StubBench(tok_s)
    first = make_driver(tmp_path, bench)
    first.max_new_starts = 3
    part = first.run()
    assert [s.role for s in part.starts] == ["base", "pr", "pr"]
    sized = dict(part.prompts)
    run = _resumed(tmp_path, bench).run()
    assert [s.role for s in run.starts] == ["base", "pr", "pr", "base", "base", "pr"]
    assert [s.index for s in run.starts] == list(range(6)) and run.prompts == sized
    assert StubServer.started == ["base", "pr", "pr", "base", "base", "pr"]


def test_a_resumed_run_may_grow_by_whole_rounds_and_keeps_its_failed_starts(tmp_path):
    """3 rounds planned, one start failed; resumed with 5 the run adds rounds 3 and 4 (P B | B P), the
    failed start stays failed (not retried, so no build gets an extra chance) and each build ends with 4 good."""
    StubServer.fail_on = {2}
    bench = StubBench(tok_s)
    make_driver(tmp_path, bench).run()
    logs: list[str] = []
    grown = _resumed(tmp_path, bench, starts=5)
    grown.log = logs.append
    run = grown.run()
    assert [(s.round, s.role) for s in run.starts] == schedule(5)
    assert StubServer.started[6:] == ["pr", "base", "base", "pr"]
    assert [s.index for s in run.starts if s.status == "failed"] == [2]
    assert {r: sum(s.role == r and s.status == "ok" for s in run.starts) for r in ("base", "pr")} == {
        "base": 5,
        "pr": 4,
    }
    assert any("grows from 3 to 5" in m for m in logs)
    assert load_run(tmp_path / "run").plan["starts"] == 5


def test_a_resumed_run_refuses_fewer_starts_or_another_plan(tmp_path):
    bench = StubBench(tok_s)
    make_driver(tmp_path, bench, starts=2).run()
    with pytest.raises(DriverError, match="may grow, not shrink"):
        _resumed(tmp_path, bench, starts=1).run()
    with pytest.raises(DriverError, match="another plan"):
        _resumed(tmp_path, bench, starts=2, levels=(1, 2)).run()
    with pytest.raises(DriverError, match="another plan"):
        _resumed(tmp_path, bench, starts=2, min_rounds=5).run()
    other = _resumed(tmp_path, bench, starts=2, dataset=Dataset("random", input_len=64))
    with pytest.raises(DriverError, match="another workload"):
        other.run()
    other = _resumed(tmp_path, bench, starts=2)
    other.server_args = ["--enforce-eager"]
    with pytest.raises(DriverError, match="server flags"):
        other.run()
    assert len(load_run(tmp_path / "run").starts) == 4  # nothing ran, nothing was written


def _record(model, weights_sha, transformers="5.17.0"):
    """A build record as moegate.model.tiny_model writes it: the spec and every file's sha256."""
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"transformers_version": transformers}))
    files = {"config.json": transformers, "model.safetensors": weights_sha}
    (model / BUILD_INFO).write_text(json.dumps({"spec": {"experts": 128}, "files": files}))


def test_a_resumed_run_refuses_other_weights_and_takes_the_same_ones_under_another_library(tmp_path):
    """The run keeps the model's hash (tiny_model.model_hash: spec, weights, tokenizer, not config.json):
    the same weights rebuilt where transformers is another release resume; other weights are refused."""
    model = tmp_path / "model"
    _record(model, "a" * 64)
    first = model_hash(model)
    bench = StubBench(tok_s)
    make_driver(tmp_path, bench, starts=2).run()
    assert load_run(tmp_path / "run").model_hash == first
    _record(model, "a" * 64, transformers="5.19.0")
    assert len(_resumed(tmp_path, bench, starts=3).run().starts) == 6
    _record(model, "b" * 64)
    with pytest.raises(DriverError, match="another model"):
        _resumed(tmp_path, bench, starts=4).run()


def test_a_run_written_before_model_hashes_and_start_times_resumes_and_says_so(tmp_path):
    """run.json from before these were kept (the H200 A/B of 2026-11-29) has neither key: it loads,
    resumes with a line saying the earlier weights are not checked, and its starts show '?' as start time."""
    _record(tmp_path / "model", "a" * 64)
    bench = StubBench(tok_s)
    make_driver(tmp_path, bench, starts=1).run()
    path = tmp_path / "run" / "run.json"
    raw = json.loads(path.read_text())
    assert raw["model_hash"] and all(s["started"] for s in raw["starts"])
    del raw["model_hash"]
    for s in raw["starts"]:
        del s["started"]
    path.write_text(json.dumps(raw))
    logs: list[str] = []
    d = _resumed(tmp_path, bench, starts=2)
    d.log = logs.append
    run = d.run()
    assert any("kept no model hash" in m for m in logs)
    assert [bool(s.started) for s in run.starts] == [False, False, True, True]
    text = report.markdown(run, compare(run.samples("base"), run.samples("pr")), plot_name=None)
    rows = [line for line in text.splitlines() if line.startswith(("| 1 | 0 |", "| 3 | 1 |"))]
    assert "| ? | ok |" in rows[0] and "| ? | ok |" not in rows[1], rows
