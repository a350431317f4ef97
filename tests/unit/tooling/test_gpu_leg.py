"""tooling/ci/gpu_leg.py, the one definition of a GPU leg: each leg's command must parse with the tier's own parser
and say what the workflow promises (the GPU flags, experts UVA-offloaded; the kernel floor; the A/B's gate and its
preflight figure); data and input faults are one line and exit 2 before anything runs."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from moegate.ab.__main__ import parser as ab_parser
from moegate.ab.__main__ import plan_of
from moegate.cli.gate import parser as gate_parser
from moegate.e2e.__main__ import _parser as e2e_parser
from moegate.e2e.gsm8k_files import gsm8k_dir
from moegate.preflight.cli import parser as preflight_parser
from tooling.ci import gpu_leg

GSM8K = gsm8k_dir()


def _builds(tmp_path: Path) -> Path:
    path = tmp_path / "builds.json"
    path.write_text(
        json.dumps(
            {
                "pr": "/b/pr/bin/python", "pr_label": "0.33.1.dev2+g2222222", "base": "/b/base/bin/python",
                "base_label": "0.33.1.dev1+g1111111", "driver": "/b/driver/bin/python", "eval": "/b/eval/bin/python",
                "models": {"random": str(tmp_path / "tiny-e2e"), "trained": "/repo/models/e2e-trained"},
            }
        )
    )  # fmt: skip
    return path


def _command(tmp_path: Path, *argv: str, capsys) -> list[str]:
    assert gpu_leg.main([*argv, "--builds", str(_builds(tmp_path)), "--reports", str(tmp_path / "r"), "--dry-run"]) == 0
    line = capsys.readouterr().out.strip()
    return shlex.split(line.split(": $ ", 1)[1])


def test_the_kernels_leg_is_moegate_gate_with_the_floor_and_the_sweep(tmp_path, capsys):
    cmd = _command(tmp_path, "kernels", "--min-kernel-tests", "40", "--sweep-cases", "5000", capsys=capsys)
    assert cmd[:4] == ["/b/pr/bin/python", "-m", "moegate", "gate"]
    opts = gate_parser().parse_args(cmd[4:])
    assert opts.vllm_python == "/b/pr/bin/python" and opts.tiers == "dispatch,kernels,sweep,diff"
    assert opts.min_kernel_tests == 40 and opts.sweep_cases == 5000 and opts.junit == tmp_path / "r" / "gate.xml"
    assert opts.page == tmp_path / "r" / "gate.md"  # beside the JUnit report: the verdict job reads its first line
    no_sweep = _command(tmp_path, "kernels", capsys=capsys)
    assert gate_parser().parse_args(no_sweep[4:]).tiers == "dispatch,kernels,diff"


def test_the_kernels_leg_runs_the_differential_tier_against_the_base_by_the_prs_promise(tmp_path, capsys):
    cmd = _command(tmp_path, "kernels", "--promise", "equivalent", capsys=capsys)
    opts = gate_parser().parse_args(cmd[4:])
    assert opts.base_python == "/b/base/bin/python" and opts.promise == "equivalent"
    assert opts.diff_json == tmp_path / "r" / "kernel-diff.json"
    builds = json.loads(_builds(tmp_path).read_text())
    del builds["base"]
    (tmp_path / "no-base.json").write_text(json.dumps(builds))
    assert gpu_leg.main(["kernels", "--builds", str(tmp_path / "no-base.json"), "--dry-run"]) == 0
    alone = gate_parser().parse_args(shlex.split(capsys.readouterr().out.split(": $ ", 1)[1])[4:])
    assert alone.tiers == "dispatch,kernels" and alone.base_python is None


@pytest.mark.skipif(not (GSM8K / "test.jsonl").is_file(), reason=f"needs GSM8K's published files in {GSM8K}")
def test_the_e2e_leg_serves_both_builds_with_the_gpu_flags_and_bounded_gsm8k(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MOEGATE_GSM8K_DIR", str(GSM8K))
    cmd = _command(tmp_path, "e2e", "--model", "trained", capsys=capsys)
    assert cmd[:5] == ["/b/driver/bin/python", "-m", "moegate", "e2e", "run"]
    opts = e2e_parser().parse_args(cmd[4:])
    assert (opts.base, opts.pr, opts.base_label, opts.pr_label) == (
        "/b/base/bin/python", "/b/pr/bin/python", "0.33.1.dev1+g1111111", "0.33.1.dev2+g2222222",
    )  # fmt: skip
    flags = shlex.split(opts.server_args)
    assert {"--offload-backend", "--cpu-offload-params", "--kv-cache-memory-bytes", "--enforce-eager"} <= set(flags)
    assert opts.gates == "greedy,gsm8k" and opts.gsm8k_cap == 250 and opts.no_gsm8k_repeat
    assert opts.model == "/repo/models/e2e-trained" and opts.gsm8k_dir == str(GSM8K)
    assert opts.report == str(tmp_path / "r" / "e2e-trained.md")
    assert opts.promise == "identical"


@pytest.mark.skipif(not (GSM8K / "test.jsonl").is_file(), reason=f"needs GSM8K's published files in {GSM8K}")
def test_the_e2e_leg_passes_the_prs_promise_to_the_e2e_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MOEGATE_GSM8K_DIR", str(GSM8K))
    cmd = _command(tmp_path, "e2e", "--model", "random", "--promise", "equivalent", capsys=capsys)
    assert e2e_parser().parse_args(cmd[4:]).promise == "equivalent"


def test_the_e2e_leg_without_gsm8k_is_one_line_before_any_server(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MOEGATE_GSM8K_DIR", str(tmp_path / "no-gsm8k"))
    assert gpu_leg.main(["e2e", "--model", "random", "--builds", str(_builds(tmp_path)), "--dry-run"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith(f"gpu leg e2e random: GSM8K: {tmp_path / 'no-gsm8k' / 'test.jsonl'} is missing")


def test_the_ab_leg_gates_at_the_threshold_with_the_preflights_bandwidth_and_graphs_on(tmp_path, capsys):
    preflight = tmp_path / "preflight.json"
    preflight.write_text('{"uva_read_gbps": 24.8, "gpu": "NVIDIA GeForce RTX 4090"}')
    cmd = _command(tmp_path, "ab", "--model", "random", "--preflight", str(preflight), capsys=capsys)
    assert cmd[:4] == ["/b/driver/bin/python", "-m", "moegate", "ab"]
    opts = ab_parser().parse_args(cmd[4:])
    plan = plan_of(opts)
    assert opts.gate and opts.gate_threshold == 0.03 and opts.preflight == preflight
    assert plan.concurrency == (1, 4, 16) and plan.starts == 3 and plan.min_starts == 3
    flags = shlex.split(opts.server_args)
    assert "--enforce-eager" not in flags and flags[flags.index("--max-num-seqs") + 1] == "16"
    advisory = _command(tmp_path, "ab", "--model", "random", "--preflight", str(preflight), "--advisory", capsys=capsys)
    assert not ab_parser().parse_args(advisory[4:]).gate


def test_the_ab_leg_without_its_preflight_is_one_line(tmp_path, capsys):
    argv = ["ab", "--model", "random", "--builds", str(_builds(tmp_path)), "--preflight", str(tmp_path / "none.json")]
    assert gpu_leg.main(argv) == 2
    assert "no such file (the leg's preflight writes it first)" in capsys.readouterr().err


def test_preflight_needs_what_the_legs_load(tmp_path, capsys):
    cmd = _command(tmp_path, "preflight", "--tier", "kernels,e2e", "--model", "random,trained", capsys=capsys)
    opts = preflight_parser().parse_args(cmd[4:])
    assert opts.leg == ["kernels", "e2e", "e2e"]  # side by side on the one GPU: free memory for all three
    ab = preflight_parser().parse_args(
        _command(tmp_path, "preflight", "--tier", "ab", "--model", "random", capsys=capsys)[4:]
    )
    assert ab.leg == ["ab"]
    assert cmd[0] == "/b/pr/bin/python" and opts.checks == "gpu,disk" and opts.need_disk_gib == gpu_leg.RUN_DISK_GIB
    assert opts.model == [str(tmp_path / "tiny-e2e"), "/repo/models/e2e-trained"]
    assert opts.need_pinned_gib == gpu_leg.KERNEL_PINNED_GIB and opts.json == tmp_path / "r" / "preflight.json"
    assert gpu_leg.main(["preflight", "--start", "--dry-run"]) == 0
    start = shlex.split(capsys.readouterr().out.split(": $ ", 1)[1])
    assert start[1:] == ["-m", "moegate", "preflight", "--checks=driver,disk", "--need-disk-gib=30"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["e2e", "--model", "qwen"], "--model qwen: the builds file names no such model (it has: random, trained)"),
        (["kernels", "--builds", "/nonexistent.json"], "--builds /nonexistent.json: not a readable JSON file"),
        (["ab", "--builds", "-"], "the ab leg needs --model NAME"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, says):
    args = [*argv] if "--builds" in argv else [*argv, "--builds", str(_builds(tmp_path))]
    args = [str(_builds(tmp_path)) if a == "-" else a for a in args]
    assert gpu_leg.main([*args, "--dry-run"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert says in err


def _stand_in_driver(tmp_path: Path, steps: list[tuple[str, int]]) -> Path:
    """An executable that stands in for the A/B driver's Python: each call prints its step's text and exits with its
    status (the first an A/B server that died of CUDA out-of-memory: moegate.ab exits 2 and prints the log's tail)."""
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    driver = tmp_path / "driver"
    driver.write_text(
        "#!" + sys.executable + "\nimport json, pathlib, sys, time\n"
        f"here = pathlib.Path({str(tmp_path)!r})\n"
        "calls = here / 'calls'\nn = len(calls.read_text().splitlines()) if calls.exists() else 0\n"
        "calls.write_text('x\\n' * (n + 1))\nsteps = json.loads((here / 'steps.json').read_text())\n"
        "text, status = steps[min(n, len(steps) - 1)]\ntime.sleep(0.3)\nprint(text, flush=True)\nsys.exit(status)\n"
    )
    driver.chmod(0o755)
    return driver


def _ab_leg(tmp_path: Path, driver: Path) -> list[str]:
    builds = json.loads(_builds(tmp_path).read_text())
    (tmp_path / "builds.json").write_text(json.dumps({**builds, "driver": str(driver)}))
    (tmp_path / "preflight.json").write_text('{"uva_read_gbps": 49.7}')
    return ["ab", "--model", "random", "--builds", str(tmp_path / "builds.json"), "--preflight", str(tmp_path / "preflight.json"),
            "--reports", str(tmp_path / "r")]  # fmt: skip


def test_an_ab_leg_whose_server_died_of_oom_beside_another_process_is_retried_and_the_retry_is_its_verdict(
    tmp_path, capsys, monkeypatch
):
    from moegate.core.faults import GpuProcess
    from tests.support.faults import OOM, neighbour

    died = f"moegate.ab: server of build pr died (exit 1); server log ...\nlast lines:\n{OOM}"
    monkeypatch.setattr(gpu_leg, "READ_UNLISTED", lambda: None)
    with neighbour() as hog:
        monkeypatch.setattr(gpu_leg, "READ_GPU", lambda: [GpuProcess(hog, 70 * 1024.0)])
        monkeypatch.setattr(gpu_leg, "WAIT_S", 0.2)
        assert gpu_leg.main(_ab_leg(tmp_path, _stand_in_driver(tmp_path, [(died, 2), ("Gate: passed", 0)]))) == 0
        out = capsys.readouterr().out
        assert (
            f"gpu leg ab random: runner fault: out of memory while 1 other process(es) held 70.0 GiB of its GPU (pid {hog}"
            in out
        )
        assert "gpu leg ab random: PASS: exit 0" in out
        (tmp_path / "calls").unlink()
        assert gpu_leg.main(_ab_leg(tmp_path, _stand_in_driver(tmp_path, [(died, 2)]))) == 3
        assert "gpu leg ab random: runner fault again: out of memory while" in capsys.readouterr().out
        (tmp_path / "calls").unlink()
        failed = "moegate.ab: gate FAILED: c=1: regressed by 6.1 %"
        assert gpu_leg.main(_ab_leg(tmp_path, _stand_in_driver(tmp_path, [(failed, 1), ("Gate: passed", 0)]))) == 1
        assert (tmp_path / "calls").read_text() == "x\n"  # a FAIL is not retried
    monkeypatch.setattr(gpu_leg, "READ_GPU", list)
    (tmp_path / "calls").unlink()
    assert gpu_leg.main(_ab_leg(tmp_path, _stand_in_driver(tmp_path, [(died, 2), ("Gate: passed", 0)]))) == 2
    assert "out of memory with the GPU to itself" in capsys.readouterr().out
