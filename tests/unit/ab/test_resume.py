"""A/B runs that span several sessions of a lent machine: ``--resume`` keeps the schedule, may grow its cap
by whole rounds until its first look, and refuses to mix in another experiment (plan, builds, flags or model)
or to move a cap its looks were planned for."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from moegate.ab import report
from moegate.ab.plan import Dataset, DriverError, load_run, schedule
from moegate.ab.verdict import judge
from moegate.core.hashing import model_hash
from moegate.dispatch.names import API_SERVER
from moegate.model.tiny_spec import BUILD_INFO
from tests.support.ab import StubBench, StubServer, make_driver, reset_stubs, tok_s  # noqa: F401 (autouse)


def noisy(label, c, server):
    """Starts 20 % apart: no look settles a level, so a run goes on to its cap."""
    return 10.0 * (1.0 + 0.2 * (server % 3))


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


def test_a_resumed_run_may_grow_by_whole_rounds_before_its_first_look_and_keeps_its_failed_starts(tmp_path):
    """3 rounds planned, 2 run, one start failed; resumed with 5 before any look the run adds rounds 2-4
    (B P | P B | B P), the failed start stays failed (not retried, so no build gets an extra chance) and each
    build ends with 4 or 5 good."""
    StubServer.fail_on = {2}
    bench = StubBench(tok_s, decode=noisy)
    first = make_driver(tmp_path, bench, min_starts=3)
    first.max_new_starts = 4
    first.run()
    logs: list[str] = []
    grown = _resumed(tmp_path, bench, starts=5, min_starts=3)
    grown.log = logs.append
    run = grown.run()
    assert [(s.round, s.role) for s in run.starts] == schedule(5)
    assert StubServer.started[4:] == ["base", "pr", "pr", "base", "base", "pr"]
    assert [s.index for s in run.starts if s.status == "failed"] == [2]
    assert {r: sum(s.role == r and s.status == "ok" for s in run.starts) for r in ("base", "pr")} == {
        "base": 5,
        "pr": 4,
    }
    assert any("grows from 3 to 5" in m for m in logs)
    assert load_run(tmp_path / "run").plan["starts"] == 5


def test_a_run_that_has_looked_keeps_its_cap_and_a_finished_one_runs_nothing_more(tmp_path):
    bench = StubBench(tok_s, decode=noisy)
    make_driver(tmp_path, bench, starts=3).run()  # looked after round 3: the cap was what alpha was split over
    with pytest.raises(DriverError, match="judged at 3 starts a build already, so its cap of 3 stays"):
        _resumed(tmp_path, bench, starts=5, min_starts=3).run()
    started = len(StubServer.started)
    again = _resumed(tmp_path, bench, starts=3).run()  # the same plan, resumed: over at its cap
    assert len(StubServer.started) == started and len(again.starts) == 6


def test_a_resumed_run_refuses_fewer_starts_or_another_plan(tmp_path):
    bench = StubBench(tok_s)
    make_driver(tmp_path, bench, starts=2).run()
    with pytest.raises(DriverError, match="another plan"):
        _resumed(tmp_path, bench, starts=2, margin=0.1).run()
    with pytest.raises(DriverError, match="another plan"):
        _resumed(tmp_path, bench, starts=2, vary_prompts=True).run()
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
    bench = StubBench(tok_s, decode=noisy)
    d = make_driver(tmp_path, bench, starts=3, min_starts=3)
    d.max_new_starts = 2
    d.run()
    assert load_run(tmp_path / "run").model_hash == first
    _record(model, "a" * 64, transformers="5.19.0")
    d = _resumed(tmp_path, bench, starts=3, min_starts=3)
    d.max_new_starts = 2
    assert len(d.run().starts) == 4
    _record(model, "b" * 64)
    with pytest.raises(DriverError, match="another model"):
        _resumed(tmp_path, bench, starts=3, min_starts=3).run()


def test_a_run_written_before_model_hashes_and_start_times_resumes_and_says_so(tmp_path):
    """run.json from before these were kept (the H200 A/B of 2026-11-29) has neither key: it loads,
    resumes with a line saying the earlier weights are not checked, and its starts show '?' as start time."""
    _record(tmp_path / "model", "a" * 64)
    bench = StubBench(tok_s)
    first = make_driver(tmp_path, bench, starts=2)
    first.max_new_starts = 2
    first.run()
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
    text = report.markdown(run, judge(run, tmp_path / "run"), plot_name=None)
    rows = [line for line in text.splitlines() if line.startswith(("| 1 | 0 |", "| 3 | 1 |"))]
    assert "| ? | ok |" in rows[0] and "| ? | ok |" not in rows[1], rows


def test_a_resumed_run_first_stops_a_server_an_earlier_killed_call_left_running(tmp_path):
    """The H200 A/B of 2026-12-03: timeout killed the driver while it stopped start 3's server, which kept
    72 GB of GPU memory; the resumed call's four starts all failed for want of it. The server's pgid file, beside
    its log in the start's folder, names it; the resumed call kills it before its first start and says so, once."""
    bench = StubBench(tok_s)
    first = make_driver(tmp_path, bench)
    first.max_new_starts = 2
    first.run()
    folder = tmp_path / "run" / "starts" / "02-pr-pr"  # the start the killed call was on: not in run.json
    folder.mkdir()
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    left = subprocess.Popen([sys.executable, "-c", stubborn, API_SERVER], start_new_session=True)
    try:
        (folder / "server.pgid").write_text(f"{left.pid}\n")
        logs: list[str] = []
        d = _resumed(tmp_path, bench)
        d.log = logs.append
        d.max_new_starts = 2
        started = StubServer.started
        assert len(d.run().starts) == 4
        assert left.wait(timeout=5) == -signal.SIGKILL
        stopped = [m for m in logs if "left running" in m]
        assert stopped == [
            f"[ab] stopped a server left running by an earlier call or a failed stop (pgid {left.pid}, start 02-pr-pr)"
        ]
        assert logs.index(stopped[0]) < next(i for i, m in enumerate(logs) if m.startswith("[ab] start 3/"))
        assert started == ["base", "pr", "pr", "base"]
        assert not (folder / "server.pgid").exists()
    finally:
        if left.poll() is None:
            os.killpg(left.pid, signal.SIGKILL)
            left.wait()
