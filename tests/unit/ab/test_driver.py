"""The A/B driver's scheduling and failure bookkeeping, the report, the evidence model, the CLI.

A real vLLM server cannot run in the unit tier (no vLLM here), so the server and the
benchmark call are stand-ins (``tests/support/ab.py``). What they check is the driver's
own logic: order of starts, warm-up then measured sweep, arguments, seeds, sizing,
failures, files kept. The real thing runs as the CPU same-build smoke and on the GPU.
Resuming a run over several sessions: ``test_ab_resume.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from moegate.ab import report
from moegate.ab.driver import Driver
from moegate.ab.plan import BenchError, Dataset, DriverError, Plan, load_run, schedule
from moegate.ab.verdict import EQUIVALENT, FAIL, IMPROVED, judge
from moegate.builds.planted import make_build
from tests.support import ROOT
from tests.support.ab import StubBench, StubServer, build, make_driver, reset_stubs, tok_s  # noqa: F401 (autouse)


def test_schedule_interleaves_a_b_b_a():
    assert schedule(3) == [(0, "base"), (0, "pr"), (1, "pr"), (1, "base"), (2, "base"), (2, "pr")]
    assert [r for _, r in schedule(4)] == ["base", "pr", "pr", "base", "base", "pr", "pr", "base"]


def test_a_run_warms_up_then_measures_every_level_with_stated_arguments(tmp_path):
    bench = StubBench(tok_s)
    run = make_driver(tmp_path, bench).run()
    assert StubServer.started == ["base", "pr", "pr", "base", "base", "pr"]
    assert all(s.status == "ok" for s in run.starts)
    per_start = [bench.calls[i : i + 6] for i in range(0, len(bench.calls), 6)]
    assert len(per_start) == 6
    seeds: dict[tuple[str, int], set[int]] = {}
    for rec, calls in zip(run.starts, per_start):
        phases = [Path(cl["json"]).name for cl in calls]
        assert phases == [
            "warmup-c1.json",
            "warmup-c2.json",
            "warmup-c4.json",
            "measured-c1.json",
            "measured-c2.json",
            "measured-c4.json",
        ]
        for cl in calls:
            o = cl["opt"]
            c = int(o["max-concurrency"])
            assert int(o["num-warmups"]) >= c and o["ignore-eos"] is True
            assert o["random-output-len"] == "16" and o["dataset-name"] == "random"
            assert o["base-url"].startswith("http://127.0.0.1:") and o["served-model-name"] == "served-model"
            assert int(o["num-prompts"]) % c == 0
        for cl in calls[3:]:
            c = int(cl["opt"]["max-concurrency"])
            assert int(cl["opt"]["num-prompts"]) == run.prompts[c] >= 4 * c
            seeds.setdefault((rec.role, c), set()).add(int(cl["opt"]["seed"]))
            assert cl["opt"]["save-detailed"] is True  # per-request times in the result dict
        warm = {int(cl["opt"]["seed"]) for cl in calls[:3]}
        assert not warm & {int(cl["opt"]["seed"]) for cl in calls[3:]}
    # every start of both builds serves the same prompts: one seed a level, all rounds, both builds
    for c in (1, 2, 4):
        assert len(seeds[("base", c)]) == 1 and seeds[("base", c)] == seeds[("pr", c)]
    assert len({next(iter(seeds[("base", c)])) for c in (1, 2, 4)}) == 3  # and another set at each level
    # every raw result JSON and run.json kept
    assert len(list((tmp_path / "run" / "starts").glob("*/measured-c*.json"))) == 18
    assert len(list((tmp_path / "run" / "starts").glob("*/warmup-c*.json"))) == 18
    again = load_run(tmp_path / "run")
    assert again.samples("pr") == run.samples("pr") and len(again.samples("pr")[2]) == 3
    rep = report.write(again, tmp_path / "run")
    assert rep.verdict.level(2).verdict == IMPROVED and rep.verdict.level(1).verdict == EQUIVALENT
    assert "| 2 | 3 / 3 |" in rep.markdown


def test_prompts_are_sized_by_time_from_the_first_warm_up(tmp_path):
    bench = StubBench(lambda label, c, seed: 100.0 * c)
    run = make_driver(tmp_path, bench, starts=1, levels=(1, 8)).run()
    # 0.5 s x 100 c tok/s / (16 tokens x c) = 3.125 -> 4 rounds floor; min_rounds=4 -> 4 rounds
    assert run.prompts == {1: 4, 8: 32}
    bench2 = StubBench(lambda label, c, seed: 1000.0 * c)
    d = Driver(
        {"base": build("base"), "pr": build("pr")},
        tmp_path / "model",
        tmp_path / "run2",
        Plan(concurrency=(1, 8), starts=1, output_len=16, target_seconds=2.0),
        Dataset("random", input_len=8),
        server_factory=StubServer,
        bench=bench2,
        log=lambda m: None,
    )
    run2 = d.run()
    assert run2.prompts == {1: 125, 8: 1000}  # 2 s x 1000 c / (16 c) = 125 rounds
    assert "sized once" in run2.prompts_note


def test_a_server_that_does_not_start_fails_that_start_only(tmp_path):
    StubServer.fail_on = {1}
    bench = StubBench(tok_s)
    run = make_driver(tmp_path, bench).run()
    failed = [s for s in run.starts if s.status == "failed"]
    assert [(s.index, s.role) for s in failed] == [(1, "pr")]
    assert "ServerError" in failed[0].error and "server 1 of pr" in failed[0].log_tail
    assert [len(run.samples("base")[c]) for c in (1, 2, 4)] == [3, 3, 3]
    assert [len(run.samples("pr")[c]) for c in (1, 2, 4)] == [2, 2, 2]
    rep = report.write(run, tmp_path / "run")
    assert "| 1 | 3 / 2 |" in rep.markdown and "Failed starts (1" in rep.markdown
    assert "server 1 of pr" in rep.markdown


def test_a_bench_error_fails_the_whole_start_and_nothing_of_it_is_counted(tmp_path):
    StubServer.die_on = {2}
    # start 2 (pr, round 1): its calls are 12..17; fail its second measured run (c=2), after c=1 was measured
    bench = StubBench(tok_s, fail={16})
    run = make_driver(tmp_path, bench).run()
    rec = run.starts[2]
    assert rec.status == "failed" and rec.role == "pr"
    assert 1 in rec.measured  # measured before the failure ...
    assert "measured run at concurrency 2" in rec.error
    assert "server died" in rec.log_tail and "server log tail" in rec.log_tail and "boom" in rec.log_tail
    assert all(len(v) == 2 for v in run.samples("pr").values())  # ... but not counted
    assert run.starts[3].status == "ok"  # the next start still runs


def test_failed_requests_fail_the_start(tmp_path):
    bench = StubBench(tok_s, failed_requests={0})
    run = make_driver(tmp_path, bench, starts=2).run()
    assert run.starts[0].status == "failed"
    assert "1 failed" in run.starts[0].error and "HTTP 500" in run.starts[0].error
    # base now has 1 good start at the cap: FAIL, naming the failed start; the gate fails
    rep = report.write(run, tmp_path / "run", gate=True)
    assert all(lv.verdict == FAIL and "base 1, PR 2" in lv.reason for lv in rep.verdict.levels)
    assert all("start 1 (base)" in lv.reason and "1 failed" in lv.reason for lv in rep.verdict.levels)
    assert not rep.verdict.gate_passed and "Gate: FAILED" in rep.markdown


def test_sharegpt_needs_enough_valid_records(tmp_path):
    ok = [
        {"id": str(i), "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
        for i in range(20)
    ]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(ok + [{"id": "x", "conversations": [{"from": "human", "value": "q"}]}]))
    d = make_driver(tmp_path, StubBench(tok_s), levels=(1, 8), dataset=Dataset("sharegpt", path=str(path)))
    with pytest.raises(DriverError, match=r"20 usable ShareGPT records .* need at least 32"):
        d.run()
    assert StubServer.started == []  # refused before any server start
    path.write_text(json.dumps(ok)[:-40])
    with pytest.raises(DriverError, match="not valid JSON"):
        make_driver(tmp_path, StubBench(tok_s), dataset=Dataset("sharegpt", path=str(path))).run()
    path.write_text(json.dumps(ok * 2))
    bench = StubBench(tok_s)
    run = make_driver(tmp_path, bench, starts=1, levels=(1, 2), dataset=Dataset("sharegpt", path=str(path))).run()
    o = bench.calls[0]["opt"]
    assert o["dataset-name"] == "sharegpt" and o["dataset-path"] == str(path) and o["sharegpt-output-len"] == "16"
    assert run.starts[0].status == "ok"


def test_the_run_adds_rounds_until_every_level_is_settled_and_logs_each_look(tmp_path):
    """The same build twice, its starts 2 % apart in the first two rounds and on the mean after: too wide
    for the first look, a round is added after each look until every level is equivalent; nothing beyond."""
    logs: list[str] = []

    def decode(label, c, server):
        return {0: 10.2, 1: 9.8}.get(server // 2, 10.0)  # by round: both starts of a round alike

    d = make_driver(tmp_path, StubBench(tok_s, decode=decode), starts=8)
    d.log = logs.append
    run = d.run()
    looks = [m for m in logs if m.startswith("[ab] look after round")]
    v = judge(run, tmp_path / "run")
    rounds = len(run.starts) // 2
    assert v.state == "settled" and 3 < rounds < 8 and all(lv.verdict == EQUIVALENT for lv in v.levels)
    assert [int(m.split()[4].rstrip(":")) for m in looks] == list(range(3, rounds + 1))
    assert "c=1 unresolved" in looks[0] and "c=1 equivalent" in looks[-1]
    assert any(f"the run is over at {rounds} starts a build (settled); no round added" in m for m in logs)


def test_bad_plans_are_refused():
    with pytest.raises(DriverError):
        Plan(concurrency=(0, 1))
    with pytest.raises(DriverError, match="first look"):
        Plan(starts=3, min_starts=4)
    with pytest.raises(DriverError, match="2 output tokens"):
        Plan(output_len=1)
    with pytest.raises(DriverError, match="must lie in"):
        Plan(alpha=0.0)
    assert Plan(starts=5).min_starts == 3 and Plan(starts=2).min_starts == 2
    with pytest.raises(DriverError):
        Dataset("random")
    with pytest.raises(DriverError):
        Dataset("sharegpt")


# --- the benchmark runner, through a real subprocess ------------------------------------------

FAKE_SERVE = """
import argparse

FlexibleArgumentParser = argparse.ArgumentParser


def add_cli_args(parser):
    parser.add_argument("--model")
    parser.add_argument("--max-concurrency", type=int)
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--ignore-eos", action="store_true")


def main(args):
    return {"completed": args.num_prompts, "failed": 0, "output_throughput": 12.5 * args.max_concurrency,
            "duration": 1.0, "model_id": args.model, "odd": object()}
"""


def test_bench_runner_in_a_build_python_with_a_stand_in_vllm(tmp_path):
    """python -m moegate.builds.bench_serve in a build whose own site carries a stand-in
    ``vllm.benchmarks.serve`` (the real one needs a server); the result dict is written as JSON."""
    pkg = tmp_path / "site" / "vllm" / "benchmarks"
    pkg.mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "serve.py").write_text(FAKE_SERVE)
    python = make_build(tmp_path / "build", sys.executable, sites=(str(tmp_path / "site"),))  # moegate: cwd

    def bench_serve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(python), "-m", "moegate.builds.bench_serve", *args],
            capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
        )  # fmt: skip

    bench_args = ["--model", "m", "--max-concurrency", "4", "--num-prompts", "8", "--ignore-eos"]
    proc = bench_serve("--json-out", str(tmp_path / "r.json"), "--", *bench_args)
    assert proc.returncode == 0, proc.stderr
    out = json.loads((tmp_path / "r.json").read_text())
    assert out["output_throughput"] == 50.0 and out["completed"] == 8 and out["model_id"] == "m"
    assert out["odd"].startswith("<object")  # non-JSON values are kept as their repr
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps(["--model", "m2", "--max-concurrency", "2"]))
    proc = bench_serve("--parse-only", "--args-json", str(args_file))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"] == "m2"


def test_the_bench_worker_imports_once_runs_many_and_survives_a_failed_run(tmp_path):
    """BenchWorkers -> python -m moegate.builds.bench_serve --worker with the stand-in vLLM: one process for
    several runs, each answered in order; a run that raises fails alone and the worker goes on."""
    pkg = tmp_path / "site" / "vllm" / "benchmarks"
    pkg.mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "serve.py").write_text(
        FAKE_SERVE.replace(
            "def main(args):\n",
            "def main(args):\n    print('noise on stdout')\n    assert args.model != 'boom', 'planted'\n",
        )
    )
    from moegate.ab.workers import BenchWorkers

    python = make_build(tmp_path / "build", sys.executable, sites=(str(tmp_path / "site"),))
    b = SimpleNamespace(label="x", python=str(python), env={}, server_args=())
    workers = BenchWorkers(tmp_path / "w", timeout_s=120)
    try:
        first = workers(b, ["--model", "m", "--max-concurrency", "2"], tmp_path / "a.json", tmp_path / "a.log")
        pid = workers.procs["x"][0].pid
        with pytest.raises(BenchError, match="planted"):
            workers(b, ["--model", "boom", "--max-concurrency", "2"], tmp_path / "b.json", tmp_path / "b.log")
        third = workers(b, ["--model", "m", "--max-concurrency", "4"], tmp_path / "c.json", tmp_path / "c.log")
        assert workers.procs["x"][0].pid == pid  # the same process all along
    finally:
        workers.close()
    assert first["output_throughput"] == 25.0 and third["output_throughput"] == 50.0
    assert "noise on stdout" in (tmp_path / "a.log").read_text()  # the benchmark's prints went to the log
    assert "AssertionError" in (tmp_path / "b.log").read_text() and not (tmp_path / "b.json").exists()
    assert not workers.procs


def test_the_driver_starts_the_benchmark_workers_of_the_builds_it_will_run_before_any_server(tmp_path):
    """vLLM's import in a worker (about 27 s a build on the H200) runs while the first server starts."""
    bench = StubBench(tok_s)
    d = make_driver(tmp_path, bench)
    d.max_new_starts = 1
    list(d.starts())
    assert bench.prestarted == [("base", 0)]  # only the build that will start, before its server
    bench.prestarted.clear()
    d.max_new_starts = None
    StubServer.started.clear()
    list(d.starts(frozenset({0})))
    assert bench.prestarted == [("pr", 0), ("base", 0)]


def test_a_prestarted_worker_is_spawned_without_waiting_and_answers_its_first_run(tmp_path):
    """prestart returns while the worker is still importing (a stand-in vLLM that takes 3 s to import);
    the first run waits for the worker to be ready and is answered by that same process."""
    pkg = tmp_path / "site" / "vllm" / "benchmarks"
    pkg.mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("import time\ntime.sleep(3)\n")
    (pkg / "__init__.py").write_text("")
    (pkg / "serve.py").write_text(FAKE_SERVE)
    from moegate.ab.workers import BenchWorkers

    python = make_build(tmp_path / "build", sys.executable, sites=(str(tmp_path / "site"),))
    b = SimpleNamespace(label="x", python=str(python), env={}, server_args=())
    workers = BenchWorkers(tmp_path / "w", timeout_s=120)
    try:
        t0 = time.monotonic()
        workers.prestart(b)
        assert time.monotonic() - t0 < 2.0 and "x" in workers.starting
        pid = workers.procs["x"][0].pid
        workers.prestart(b)  # a second prestart is a no-op
        out = workers(b, ["--model", "m", "--max-concurrency", "2"], tmp_path / "a.json", tmp_path / "a.log")
        assert workers.procs["x"][0].pid == pid and not workers.starting
    finally:
        workers.close()
    assert out["output_throughput"] == 25.0
