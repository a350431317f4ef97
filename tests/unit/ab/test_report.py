"""The A/B's evidence columns, its report (table, plot, verdict) and its command line, on synthetic runs: no server."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from moegate.ab import report
from moegate.ab.__main__ import main as cli
from moegate.ab.evidence import MoEShape, TrafficModel, expected_unique_experts, naive_region
from moegate.ab.plan import Run, schedule
from moegate.ab.verdict import IMPROVED
from tests.support import ROOT

# --- evidence -------------------------------------------------------------------------------


QWEN30B = MoEShape(experts=128, top_k=8, hidden=2048, intermediate=768, layers=48, bytes_per_element=2)


def test_cli_expect_same_fails_on_any_claim_and_names_it(tmp_path, capsys):
    """An A/A run passes only when every level is within spread; a claimed difference fails in one line."""
    run = synthetic_run()  # the change description's tables: improved at 2 in flight
    (tmp_path / "run.json").write_text(json.dumps(run.to_json()))
    assert cli(["--report-only", str(tmp_path), "--no-evidence", "--expect-same"]) == 1
    err = capsys.readouterr().err
    assert "A/A run FAILED" in err and "c=2: improved" in err
    bases = [s for s in run.starts if s.role == "base"]
    prs = [s for s in run.starts if s.role == "pr"]
    for pr, base in zip(prs, bases):  # the PR's good starts become copies of the base's (a failed one stays failed)
        pr.status, pr.measured = base.status, dict(base.measured)
    (tmp_path / "run.json").write_text(json.dumps(run.to_json()))
    assert cli(["--report-only", str(tmp_path), "--no-evidence", "--expect-same"]) == 0


def test_uniform_routing_unique_experts_and_bytes():
    assert expected_unique_experts(128, 8, 1) == pytest.approx(8)
    assert expected_unique_experts(128, 8, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))
    assert QWEN30B.expert_bytes == 3 * 768 * 2048 * 2
    assert [naive_region(QWEN30B, c) for c in (1, 4, 5)] == [True, True, False]
    tm = TrafficModel(QWEN30B, uva_peak_gbps=51.0)
    lv = tm.level(4)
    assert lv.paths == {"base": "naive", "pr": "sorted"}
    assert lv.naive_bytes == 32 * QWEN30B.expert_bytes * 48
    assert lv.sorted_bytes == pytest.approx(expected_unique_experts(128, 8, 4) * QWEN30B.expert_bytes * 48)
    assert tm.level(8).paths == {"base": "sorted", "pr": "sorted"}
    # 20 tok/s at 4 in flight = 5 steps/s
    assert tm.achieved_gbps(4, "base", 20.0) == pytest.approx(lv.naive_bytes * 5 / 1e9)
    half = TrafficModel(QWEN30B, host_fraction=0.5)
    assert half.level(4).naive_bytes == pytest.approx(lv.naive_bytes / 2)


def test_measured_routing_sample_through_the_traffic_model():
    tm = TrafficModel(QWEN30B, routing={2: [[[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 8, 9, 10, 11]]]})
    lv = tm.level(2)
    assert (lv.pairs, lv.unique) == (16, 12) and "routing sample" in lv.source
    assert tm.level(3).source == "uniform model"


def test_moe_shape_from_text_and_config(tmp_path):
    assert MoEShape.parse("experts=128,top_k=8,hidden=2048,intermediate=768,layers=48") == QWEN30B
    with pytest.raises(ValueError, match="missing"):
        MoEShape.parse("experts=128")
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "num_experts": 128,
                "num_experts_per_tok": 8,
                "hidden_size": 2048,
                "moe_intermediate_size": 768,
                "num_hidden_layers": 48,
                "torch_dtype": "bfloat16",
                "quantization_config": {"quant_method": "fp8"},
            }
        )
    )
    shape = MoEShape.from_config(tmp_path)
    assert shape is not None
    assert shape.experts == 128 and shape.layers == 48 and shape.bytes_per_element == 1
    assert MoEShape.from_config(tmp_path / "nothing") is None


# --- report ---------------------------------------------------------------------------------


def synthetic_run() -> Run:
    from moegate.ab.plan import StartRecord

    base = {1: [20.6, 20.7, 20.8], 2: [22.1, 22.2, 22.3], 4: [23.0, 23.1, 23.2], 8: [34.5, 34.9, 34.7]}
    pr = {1: [20.5, 20.7, 20.6], 2: [23.7, 23.8, 23.9], 4: [26.5, 27.0, 27.4], 8: [33.5, 35.0, 34.2]}
    starts = []
    for i, (r, role) in enumerate(schedule(3)):
        src = base if role == "base" else pr
        starts.append(
            StartRecord(
                i, r, role, role, "ok", measured={c: v[r] for c, v in src.items()}, durations={c: 30.0 for c in src}
            )
        )
    starts.append(StartRecord(6, 3, "pr", "pr", "failed", error="ServerError: boom <x>", log_tail="last line"))
    return Run(
        {r: {"label": r, "python": "py", "server_args": [], "env": {}} for r in ("base", "pr")},
        "/models/qwen",
        ["--enforce-eager"],
        {"concurrency": [1, 2, 4, 8], "warmup_rounds": 2},
        "random prompts",
        {1: 8, 2: 16, 4: 32, 8: 64},
        "fixed",
        starts,
    )


def test_report_markdown_and_plot(tmp_path):
    rep = report.write(synthetic_run(), tmp_path, TrafficModel(QWEN30B), gate=True)
    md = (tmp_path / "report.md").read_text()
    assert md == rep.markdown
    assert (
        "| in flight | starts (base / PR) | output tok/s, base | output tok/s, PR | change [CI] | verdict "
        "| starts a build to resolve ±5% |" in md
    )
    assert "| 2 | 3 / 3 | 22.1–22.3 | 23.7–23.9 | +7.2%" in md and "**improved**" in md
    assert "| 8 | 3 / 3 | 34.5–34.9 | 33.5–35.0 |" in md and "within spread" in md
    assert "(naive) /" in md and "achieved GB/s" in md and "Gate: passed" in md
    assert "Failed starts (1" in md and "&lt;x&gt;" in md and "last line" in md
    png = tmp_path / "throughput.png"
    assert png.is_file() and png.stat().st_size > 5000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    raw = json.loads((tmp_path / "verdict.json").read_text())
    assert raw["levels"][1]["verdict"] == IMPROVED and "traffic" in raw and raw["gate_passed"] is True
    # every level with spread says how many starts a build would resolve a 5 % change; the cell is that figure
    needed = [lv["starts_needed"] for lv in raw["levels"]]
    assert all(isinstance(n, int) and n >= 2 for n in needed), needed
    row8 = next(ln for ln in md.splitlines() if ln.startswith("| 8 | 3 / 3 |"))
    assert row8.split("|")[7].strip() == str(needed[3])


@pytest.mark.parametrize(
    ("ci", "shown"),
    [((0.95, 1.2), "[−5.0%, +20.0%]"), ((0.0, 2.2e21), "[−100.0%, > +900%]"), ((0.5, 10.0), "[−50.0%, +900.0%]")],
    ids=["ordinary", "unbounded above", "at the edge"],
)
def test_an_interval_past_ten_times_the_base_reads_as_unbounded(ci, shown):
    level = SimpleNamespace(ratio=1.1, change=0.1, ci=ci)
    assert report._change_cell(level) == f"+10.0% {shown}"


def test_cli_report_only_and_gate(tmp_path, capsys):
    run = synthetic_run()
    for s in run.starts:  # make the PR 10 % slower at every level
        if s.role == "pr" and s.status == "ok":
            s.measured = {c: v * 0.85 for c, v in s.measured.items()}
    (tmp_path / "run.json").write_text(json.dumps(run.to_json()))
    assert cli(["--report-only", str(tmp_path)]) == 0
    # recomputed away from the model: the evidence columns are dropped, and it says so
    assert "no evidence columns" in capsys.readouterr().err
    assert cli(["--report-only", str(tmp_path), "--gate"]) == 1
    assert (tmp_path / "throughput.png").is_file()
    shape = "--moe-shape=experts=128,top_k=8,hidden=2048,intermediate=768,layers=48"
    assert cli(["--report-only", str(tmp_path), shape, "--host-sorted", "both"]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "(sorted) / " in md and "(naive)" not in md
    assert cli(["--report-only", str(tmp_path), shape, "--no-evidence"]) == 0
    assert "achieved GB/s" not in (tmp_path / "report.md").read_text()


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    assert cli(["--base-python", sys.executable, "--pr-python", sys.executable]) == 2
    assert capsys.readouterr().err.strip() == "moegate.ab: --model is required"
    assert cli(["--report-only", str(tmp_path)]) == 2
    assert "no run.json" in capsys.readouterr().err
    assert cli(["--model", "m", "--random-input-len", "8", "--pr-python", sys.executable]) == 2
    assert "--base-python is required" in capsys.readouterr().err


def test_bench_serve_without_vllm_is_one_line():
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM is importable here: the missing-vLLM path cannot be shown")
    except ImportError:
        pass
    proc = subprocess.run(
        [sys.executable, "-m", "moegate.vllm.bench_serve", "--json-out", "x.json", "--", "--model", "m"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "cannot import vllm.benchmarks.serve" in proc.stderr


@pytest.mark.skipif(__import__("shutil").which("nox") is None, reason="nox is not installed in this environment")
def test_nox_ab_session_refuses_bad_arguments_with_one_line():
    """nox reads only the builds (`--base=`, `--pr=`); every other argument is the A/B command line's to refuse."""
    proc = subprocess.run(
        ["nox", "-s", "ab", "--", "--frobnicate"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode != 0 and "nox -s ab needs --base=SPEC --pr=SPEC" in proc.stdout + proc.stderr
    proc = subprocess.run(
        ["nox", "-s", "ab", "--", "--base"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode != 0 and "argument --base needs a value: --base=..." in proc.stdout + proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "moegate.ab", "--frobnicate"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].endswith(
        "unrecognized arguments: --frobnicate"
    )
