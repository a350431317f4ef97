"""The kernel-tier benchmark's workers and script, on a CPU: everything but vLLM and the GPU.

- the cases: one seeded Hypothesis run, the same seed the same cases (whatever the number of workers);
- the figures: tallies merged (counts added, worst error kept, failures in worker order), stage seconds
  summed, the wall clock kept apart from the workers' busy seconds;
- the Triton cache: the directory the run uses and what chose it, its entries counted;
- the processes, spawned for real with a stand-in runner: every case run once and reported for the
  progress display, a warm replay, a worker that raises named with its index and case, one that dies
  named with its exit code, a start-up failure stopping the run before the clock;
- the script: one line and exit 2 without vLLM or without a GPU, the JSON written whole or not at all.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from moegate.core.case import ALL_PLACEMENTS, ENTRYPOINTS, MoECase, Quant
from moegate.core.spec import expected_path
from moegate.dispatch import names
from moegate.kernels import sweep
from moegate.kernels.check import KernelResult, StageClock
from moegate.kernels.resources import auto_workers, cache_entries, triton_cache_dir
from moegate.kernels.tally import Tally, WorkerReport, merge, profile_line
from moegate.kernels.tolerance import Closeness, rounding_count
from moegate.kernels.workers import Options, Pool, WorkerFailed
from tests.support import ROOT


def case(tokens: int, **fields: Any) -> MoECase:
    return MoECase(num_tokens=tokens, top_k=2, num_experts=16, hidden=128, intermediate=256, **fields)


def result(c: MoECase, entrypoint: str, *, ratio: float = 0.5, path: str | None = None) -> KernelResult:
    closeness = Closeness(max_abs_err=ratio * 1e-3, worst_ratio=ratio, rel_max_err=ratio * 1e-3, ok=ratio <= 1.0)
    taken = path if path is not None else expected_path(c, entrypoint).path.value
    return KernelResult(c, entrypoint, taken, torch.zeros(1), closeness)


# --- the cases ---------------------------------------------------------------------------


def test_the_same_seed_draws_the_same_cases_and_another_seed_others() -> None:
    from moegate.strategies.kernels import kernel_cases

    strategies = {ep: kernel_cases(ep, expert_map=None, quant=None) for ep in ENTRYPOINTS}

    def drawn(seed: int) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        sweep.draw_cases(40, seed, strategies, lambda c, ep: out.append((ep, c.to_json())))
        return out

    first = drawn(0)
    assert len(first) == 40
    assert drawn(0) == first
    assert drawn(1) != first


# --- the figures -------------------------------------------------------------------------


def test_merge_adds_counts_keeps_the_worst_error_and_lists_failures_in_worker_order() -> None:
    a, b = Tally(), Tally()
    a.add(case(1), "legacy", result(case(1), "legacy", ratio=0.5))
    a.add(case(2), "modular", result(case(2), "modular", ratio=2.0))  # a numeric failure
    int8 = case(3, quant=Quant("int8_w8a16", 64))
    b.add(int8, "legacy", result(int8, "legacy", ratio=0.25))
    b.add(case(4), "legacy", result(case(4), "legacy", ratio=0.75, path="naive-not-the-spec"))  # a path mismatch
    reports = [
        WorkerReport(1, b, 7.0, {"vllm": 5.0, "reference": 1.0}, {}),
        WorkerReport(0, a, 9.0, {"vllm": 6.0, "inputs": 1.0}, {}),
    ]
    p = merge(reports, seconds=9.5)
    stats = p.tally.stats
    assert stats["cases"] == 4 and stats["numeric_fail"] == 1 and stats["path_mismatch"] == 1
    assert stats["quant_int8_w8a16"] == 1
    # the worst err/tol in units of its family's rounding count: 2.0 of worker 0 beats worker 1's 0.75
    bf16 = rounding_count(torch.bfloat16)
    assert p.tally.worst == {
        "unquantized-bfloat16": 2.0 * bf16,
        "wNa16": 0.25 * rounding_count(torch.bfloat16, int8.quant),
    }
    assert [f.split(" ")[0] for f in p.tally.failures] == ["modular", "path"]  # worker 0's, then worker 1's
    assert p.stages == {"vllm": 11.0, "reference": 1.0, "inputs": 1.0}
    assert p.seconds == 9.5 and p.worker_seconds == 16.0
    assert [r.index for r in p.workers] == [0, 1]


def test_profile_line_gives_the_rest_of_the_busy_time_and_says_when_stages_are_summed() -> None:
    t = Tally()
    for i in range(10):
        t.add(case(1 + i % 4), "legacy", result(case(1 + i % 4), "legacy"))
    one = merge([WorkerReport(0, t, 5.0, {"vllm": 3.0, "inputs": 1.0}, {})], seconds=5.0)
    line = profile_line("first pass (cold)", one)
    assert line.startswith("first pass (cold): 10 cases in 5.0 s (2.00 cases/s): inputs 1.0 s, vllm 3.0 s")
    assert line.endswith("the rest 1.0 s")
    two = merge([WorkerReport(0, t, 5.0, {"vllm": 3.0}, {}), WorkerReport(1, Tally(), 4.0, {"vllm": 4.0}, {})], 5.0)
    line = profile_line("cold", two)
    assert "vllm 7.0 s" in line and "the rest 2.0 s" in line and "summed over 2 workers, 9.0 s busy" in line


# --- the Triton cache --------------------------------------------------------------------


def test_triton_cache_dir_is_the_flag_then_tritons_own_rule(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    assert triton_cache_dir(str(flag), {"TRITON_CACHE_DIR": "/elsewhere"}) == (flag, "--triton-cache")
    assert triton_cache_dir(None, {"TRITON_CACHE_DIR": str(tmp_path / "env")}) == (tmp_path / "env", "TRITON_CACHE_DIR")
    home = triton_cache_dir(None, {"TRITON_HOME": str(tmp_path)})
    assert home == (tmp_path / ".triton" / "cache", "Triton's default")
    default, source = triton_cache_dir(None, {})
    assert default == Path.home() / ".triton" / "cache" and source == "Triton's default"


def test_cache_entries_counts_one_per_kernel_directory(tmp_path: Path) -> None:
    assert cache_entries(tmp_path / "missing") == 0
    for key in ("a1", "b2", "c3"):
        (tmp_path / key).mkdir()
        (tmp_path / key / "kernel.cubin").write_bytes(b"")
    (tmp_path / "stray.lock").write_text("")
    assert cache_entries(tmp_path) == 3


# --- the processes, with a stand-in runner ------------------------------------------------


class StandIn:
    """A runner without vLLM: a numeric failure at ``fail_tokens``, an exception at ``raise_tokens``,
    the process gone at ``exit_tokens``; ``broken`` fails at start-up. Each case takes a few ms."""

    def __init__(
        self, fail_tokens: int = -1, raise_tokens: int = -1, exit_tokens: int = -1, broken: bool = False
    ) -> None:
        if broken:
            raise RuntimeError("no GPU in this stand-in")
        self.fail_tokens, self.raise_tokens, self.exit_tokens = fail_tokens, raise_tokens, exit_tokens
        self.info = {"vllm": "stand-in", "fp8": False, "env": {}, "triton_cache": None, "pid": os.getpid()}

    def run(self, c: MoECase, entrypoint: str, clock: StageClock | None) -> KernelResult:
        if c.num_tokens == self.raise_tokens:
            raise ValueError("the stand-in's kernel raised")
        if c.num_tokens == self.exit_tokens:
            os._exit(3)
        if clock is not None:
            with clock.stage("vllm"):
                time.sleep(0.002)
        else:
            time.sleep(0.002)
        return result(c, entrypoint, ratio=2.0 if c.num_tokens == self.fail_tokens else 0.5)

    def sync(self) -> None:
        pass

    def memory(self) -> dict[str, int]:
        return {"peak_allocated": 1, "peak_reserved": 2, "weights_device": 3, "weights_pinned": 4}


CASES = [(case(1 + i % 9, placement=ALL_PLACEMENTS[i % 4]), ENTRYPOINTS[i % 2]) for i in range(24)]


def test_workers_run_every_case_once_report_each_for_progress_and_replay_them_warm() -> None:
    seen: list[bool] = []
    with Pool(2, functools.partial(StandIn, fail_tokens=5), Options(budget_s=60, profile=True)) as pool:
        pool.on_case = seen.append
        info = pool.start()
        assert sorted(info) == [0, 1] and info[0]["pid"] != info[1]["pid"] and info[0]["startup_s"] >= 0
        pool.release()
        for c, ep in CASES:
            pool.submit(c, ep)
        cold = pool.finish()
        warm, _ = pool.replay()
    expected_failures = sum(c.num_tokens == 5 for c, _ in CASES)
    assert cold.tally.stats["cases"] == len(CASES) == len(seen)
    assert cold.tally.stats["numeric_fail"] == expected_failures == sum(seen)
    assert sum(r.tally.stats["cases"] for r in cold.workers) == len(CASES)
    assert [r.index for r in cold.workers] == [0, 1] and cold.workers[0].memory["weights_pinned"] == 4
    assert 0 < cold.seconds and cold.stages["vllm"] > 0
    assert warm.tally.stats == cold.tally.stats  # each worker replays exactly the cases it ran


def _run_failing(pool: Pool) -> WorkerFailed:
    """Feed every case to a pool whose stand-in fails; the error the pool raises."""
    with pool, pytest.raises(WorkerFailed) as failed:
        pool.start()
        pool.release()
        for c, ep in CASES:
            pool.submit(c, ep)
        pool.finish()
    return failed.value


def test_a_worker_that_raises_is_named_with_its_case_and_the_others_are_reaped() -> None:
    pool = Pool(2, functools.partial(StandIn, raise_tokens=7), Options(budget_s=60, profile=False))
    error = _run_failing(pool)
    (index, text), *_ = error.errors.items()
    assert index in (0, 1)
    assert '"num_tokens":7' in text and "ValueError: the stand-in's kernel raised" in text
    assert f"worker {index}: ValueError" in str(error)
    assert pool.skipped > 0  # it stopped feeding
    assert all(not p.is_alive() for p in pool._procs)


def test_a_worker_that_dies_is_named_with_its_exit_code() -> None:
    pool = Pool(2, functools.partial(StandIn, exit_tokens=3), Options(budget_s=60, profile=False))
    error = _run_failing(pool)
    assert any("exited with code 3 without a report" in text for text in error.errors.values())


def test_a_start_up_failure_stops_the_run_before_the_clock() -> None:
    pool = Pool(2, functools.partial(StandIn, broken=True), Options(budget_s=60, profile=False))
    with pool, pytest.raises(WorkerFailed) as failed:
        pool.start()
    assert sorted(failed.value.errors) == [0, 1]
    assert "RuntimeError: no GPU in this stand-in" in str(failed.value)
    assert not pool._go.is_set()


# --- the script ------------------------------------------------------------------------------


def test_without_vllm_or_a_gpu_the_script_says_so_in_one_line_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = sweep
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == names.PACKAGE else real(name, *a))
    assert module.main(["--workers", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        "bench_kernels: vLLM is not importable here; the kernel tier needs vLLM and a CUDA GPU"
    ]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == names.PACKAGE else None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert module.main(["--workers", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and "needs a CUDA GPU" in err
    assert module.main(["--workers", "9", "--cases", "4"]) == 2
    assert (
        capsys.readouterr().err.strip() == "bench_kernels: --workers must be auto or between 1 and --cases (4); got 9"
    )
    assert module.main(["--workers", "all"]) == 2
    assert "--workers must be auto or between" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("gpu_gib", "host_gib", "cores", "expected"),
    [(139.8, 125.7, 16, 8), (23.65, 62.5, 16, 2), (80, 32, 32, 3), (24, 128, 2, 1), (4, 8, 1, 1)],
    ids=["H200 machine", "RTX 4090 (24 GB: 23.65 GiB)", "host memory binds", "cores bind", "never below one"],
)
def test_auto_workers_is_the_tightest_of_gpu_host_and_cores(
    gpu_gib: float, host_gib: float, cores: int, expected: int
) -> None:
    assert auto_workers(int(gpu_gib * 2**30), int(host_gib * 2**30), cores) == expected


@pytest.mark.skipif(
    importlib.util.find_spec(names.PACKAGE) is not None and torch.cuda.is_available(),
    reason="vLLM and a GPU are here: the script would run the benchmark",
)
def test_the_script_run_as_a_program_without_vllm_or_a_gpu_prints_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "moegate.kernels.sweep", "--workers", "2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("fail_tokens", [2, -1], ids=["a case fails: exit 1", "none fails: exit 0"])
def test_the_script_end_to_end_with_stand_in_workers(
    fail_tokens: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Everything the script does on a GPU but the GPU's part: arguments, cache, workers, lines, JSON, exit."""
    module = sweep
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == names.PACKAGE else real(name, *a)
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(module, "VllmRunner", functools.partial(StandIn, fail_tokens=fail_tokens))
    monkeypatch.setenv("TRITON_CACHE_DIR", "restored-after-the-test")
    cache, out = tmp_path / "triton", tmp_path / "kernels.json"
    (cache / "compiled-before").mkdir(parents=True)
    argv = ["--cases", "30", "--workers", "2", "--triton-cache", str(cache), "--json", str(out), "--profile"]
    assert module.main(argv) == (1 if fail_tokens > 0 else 0)
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    failed = [line for line in captured.err.splitlines() if "failed the kernel tier's checks" in line]
    assert len(failed) == (1 if fail_tokens > 0 else 0), captured.err
    assert lines[0] == f"bench_kernels: Triton cache {cache} (--triton-cache): 1 entries at start"
    summary = next(line for line in lines if "cases/s" in line and line.startswith("bench_kernels: vLLM"))
    assert summary.startswith("bench_kernels: vLLM stand-in: 30 cases in ") and ", workers 2; {" in summary
    assert sum(line.startswith("bench_kernels: worker ") for line in lines) == 2
    assert any(line.startswith("first pass (cold), 2 workers: 30 cases") for line in lines)
    assert any(line.startswith("replay of the same cases (warm), 2 workers: 30 cases") for line in lines)
    report = json.loads(out.read_text())
    assert report["cases"] == 30 and report["workers"] == 2 and report["seed"] == 0
    assert report["triton_cache"] == {
        "dir": str(cache),
        "source": "--triton-cache",
        "entries_start": 1,
        "entries_end": 1,
        "new": 0,
    }
    assert [w["index"] for w in report["per_worker"]] == [0, 1]
    assert sum(w["cases"] for w in report["per_worker"]) == 30
    assert report["stats"].get("numeric_fail", 0) == len(report["failures"])
    assert report["profile"]["warm_replay"]["cases"] == 30


def test_the_report_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "kernels.json"
    sweep.write_report(path, {"cases": 5})
    before = path.read_text()
    with pytest.raises(TypeError):
        sweep.write_report(path, {"cases": 6, "bad": object()})  # fails while serialising
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["kernels.json"]
