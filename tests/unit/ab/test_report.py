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
from moegate.ab.verdict import EQUIVALENT, FAIL, IMPROVED, UNRESOLVED
from tests.support import ROOT

# --- evidence -------------------------------------------------------------------------------


QWEN30B = MoEShape(experts=128, top_k=8, hidden=2048, intermediate=768, layers=48, bytes_per_element=2)


def test_cli_expect_same_fails_on_any_claim_and_names_it(tmp_path, capsys):
    """An A/A run passes unless a level claims a difference or fails; a claim fails it in one line."""
    synthetic_run(tmp_path)  # the PR decodes faster at 2 and 4 in flight
    assert cli(["--report-only", str(tmp_path), "--no-evidence", "--expect-same"]) == 1
    err = capsys.readouterr().err
    assert "A/A run FAILED" in err and "c=2: improved" in err
    synthetic_run(tmp_path, pr_decode=BASE_DECODE)  # the PR's starts decode as the base's
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


BASE_DECODE = {1: [10.0, 10.1, 10.05], 2: [12.0, 12.1, 12.05], 4: [24.0, 24.1, 24.05], 8: [28.0, 28.5, 28.2]}
PR_DECODE = {1: [10.02, 10.08, 10.0], 2: [11.0, 11.05, 11.1], 4: [18.0, 18.1, 18.05], 8: [28.1, 28.4, 28.3]}


def synthetic_run(folder, pr_decode=None, scale=1.0) -> Run:
    """The change description's tok/s tables with decode times a token beside them (vLLM's summary form in
    each measured result), written as a run folder; a failed fourth PR start with its log tail."""
    from moegate.ab.plan import StartRecord

    base = {1: [20.6, 20.7, 20.8], 2: [22.1, 22.2, 22.3], 4: [23.0, 23.1, 23.2], 8: [34.5, 34.9, 34.7]}
    pr = {1: [20.5, 20.7, 20.6], 2: [23.7, 23.8, 23.9], 4: [26.5, 27.0, 27.4], 8: [33.5, 35.0, 34.2]}
    decode = {"base": BASE_DECODE, "pr": pr_decode or PR_DECODE}
    starts = []
    for i, (r, role) in enumerate(schedule(3)):
        src = base if role == "base" else pr
        rec = StartRecord(
            i, r, role, role, "ok", measured={c: v[r] for c, v in src.items()}, durations={c: 30.0 for c in src},
            folder=f"starts/{i:02d}-{role}",
        )  # fmt: skip
        starts.append(rec)
        for c in src:
            ms = decode[role][c][r] * (scale if role == "pr" else 1.0)
            (folder / rec.folder).mkdir(parents=True, exist_ok=True)
            (folder / rec.folder / f"measured-c{c}.json").write_text(
                json.dumps({"median_tpot_ms": ms, "mean_tpot_ms": ms, "std_tpot_ms": 0.01 * ms, "completed": 8})
            )
    starts.append(StartRecord(6, 3, "pr", "pr", "failed", error="ServerError: boom <x>", log_tail="last line"))
    run = Run(
        {r: {"label": r, "python": "py", "server_args": [], "env": {}} for r in ("base", "pr")},
        "/models/qwen",
        ["--enforce-eager"],
        {
            "concurrency": [1, 2, 4, 8],
            "warmup_rounds": 2,
            "starts": 4,
            "min_starts": 3,
            "vary_prompts": False,
            "alpha": 0.05,
            "margin": 0.05,
        },
        "random prompts",
        {1: 8, 2: 16, 4: 32, 8: 64},
        "fixed",
        starts,
    )
    (folder / "run.json").write_text(json.dumps(run.to_json()))
    return run


def test_report_markdown_and_plot(tmp_path):
    rep = report.write(synthetic_run(tmp_path), tmp_path, TrafficModel(QWEN30B), gate=True)
    md = (tmp_path / "report.md").read_text()
    assert md == rep.markdown
    assert (
        "| in flight | starts (base / PR) | output tok/s, base | output tok/s, PR | tok/s change "
        "| decode ms a token, base | PR | decode speed-up [CI] | verdict |" in md
    )
    assert "| 2 | 3 / 3 | 22.1–22.3 | 23.7–23.9 | +7.2% | 12.00–12.10 | 11.00–11.10 | +9.0% [" in md
    assert "**improved**" in md and "equivalent (±5%)" in md
    assert "(naive) /" in md and "byte bound" in md and "achieved GB/s" in md and "Gate: passed" in md
    assert "Failed starts (1" in md and "&lt;x&gt;" in md and "last line" in md
    assert "NOT MEASURED ON THIS MACHINE" in md  # the default UVA figure says so
    png = tmp_path / "throughput.png"
    assert png.is_file() and png.stat().st_size > 5000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    raw = json.loads((tmp_path / "verdict.json").read_text())
    assert [lv["verdict"] for lv in raw["levels"]] == [EQUIVALENT, IMPROVED, IMPROVED, EQUIVALENT]
    assert "traffic" in raw and raw["gate_passed"] is True and raw["state"] == "settled"
    assert raw["levels"][1]["speedup"] == pytest.approx(12.05 / 11.05 - 1, abs=1e-3)
    assert raw["levels"][1]["tok_s_change"] == pytest.approx(23.8 / 22.2 - 1, abs=1e-3)


@pytest.mark.parametrize(
    ("ci", "shown"),
    [((0.95, 1.2), "[−16.7%, +5.3%]"), ((0.05, 1.01), "[−1.0%, > +900%]")],
    ids=["ordinary", "unbounded"],
)
def test_the_speedup_interval_is_the_decode_ratios_turned_over_and_a_wide_bound_reads_as_unbounded(ci, shown):
    level = SimpleNamespace(ratio=1 / 1.1, speedup=0.1, speedup_ci=(1 / ci[1] - 1, 1 / ci[0] - 1))
    assert report._speedup_cell(level) == f"+10.0% {shown}"  # type: ignore[arg-type]


def test_cli_report_only_and_gate(tmp_path, capsys):
    synthetic_run(tmp_path, scale=1.3)  # the PR decodes 30 % slower than the table: regressed at 1 and 8
    assert cli(["--report-only", str(tmp_path)]) == 0
    # recomputed away from the model: the evidence columns are dropped, and it says so
    assert "no evidence columns" in capsys.readouterr().err
    assert cli(["--report-only", str(tmp_path), "--gate"]) == 1
    assert "regressed, decode time +30" in capsys.readouterr().err
    assert (tmp_path / "throughput.png").is_file()
    shape = "--moe-shape=experts=128,top_k=8,hidden=2048,intermediate=768,layers=48"
    assert cli(["--report-only", str(tmp_path), shape, "--host-sorted", "both"]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "(sorted) / " in md and "(naive)" not in md
    assert cli(["--report-only", str(tmp_path), shape, "--no-evidence"]) == 0
    assert "achieved GB/s" not in (tmp_path / "report.md").read_text()
    assert cli(["--report-only", str(tmp_path), "--alpha", "0.1"]) == 2  # the run's looks spent 0.05
    assert "planned at alpha 0.05" in capsys.readouterr().err


def test_the_uva_figure_comes_from_the_preflight_and_the_report_names_it(tmp_path, capsys):
    synthetic_run(tmp_path)
    shape = "--moe-shape=experts=128,top_k=8,hidden=2048,intermediate=768,layers=48"
    pre = tmp_path / "pre.json"
    pre.write_text(json.dumps({"gpu": "NVIDIA H200", "uva_read_gbps": 47.5, "ok": True}))
    assert cli(["--report-only", str(tmp_path), shape, "--preflight", str(pre)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "UVA peak 47.5" in md and "measured by the runner's preflight (pre.json, NVIDIA H200)" in md
    raw = json.loads((tmp_path / "verdict.json").read_text())["traffic"]
    assert raw["uva_peak_gbps"] == 47.5 and "preflight" in raw["uva_peak_source"]
    assert cli(["--report-only", str(tmp_path), shape, "--uva-peak-gbps", "40"]) == 0
    assert "given on the command line" in (tmp_path / "report.md").read_text()
    capsys.readouterr()
    assert cli(["--report-only", str(tmp_path), shape]) == 0
    assert "NOT MEASURED ON THIS MACHINE" in capsys.readouterr().err  # the default, said loudly
    for bad, said in (
        ({"uva_read_gbps": "fast"}, "no positive number under 'uva_read_gbps'"),
        ({"gpu": "x"}, "no positive number"),
        ([1, 2], "no positive number"),
    ):
        pre.write_text(json.dumps(bad))
        assert cli(["--report-only", str(tmp_path), shape, "--preflight", str(pre)]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and err.count("\n") == 0
    pre.write_text("{not json")
    assert cli(["--report-only", str(tmp_path), shape, "--preflight", str(pre)]) == 2
    assert "not a readable JSON file" in capsys.readouterr().err
    assert cli(["--report-only", str(tmp_path), shape, "--preflight", str(pre), "--uva-peak-gbps", "4"]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_level_without_decode_times_for_a_build_is_fail_not_dropped(tmp_path):
    run = synthetic_run(tmp_path)
    run.plan["starts"], run.starts = 3, run.starts[:6]  # over at its cap of 3 rounds
    for f in (tmp_path / "starts").glob("*-pr/measured-c8.json"):
        f.unlink()
    rep = report.write(run, tmp_path, with_plot=False, gate=True)
    lv = rep.verdict.level(8)
    assert lv.verdict == FAIL and "base 3, PR 0" in lv.reason and "no decode time in the result files" in lv.reason
    assert rep.verdict.level(4).verdict == IMPROVED and "**FAIL**" in rep.markdown and "Gate: FAILED" in rep.markdown
    assert UNRESOLVED not in [x.verdict for x in rep.verdict.levels]


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
        [sys.executable, "-m", "moegate.builds.bench_serve", "--json-out", "x.json", "--", "--model", "m"],
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


def test_a_run_keeps_its_evidence_inputs_so_a_report_recomputed_away_from_the_model_draws_the_same_columns(
    tmp_path, monkeypatch, capsys
):
    """A report recomputed from a CI artifact has no model folder to read the MoE shape from: the run folder
    keeps the shape, the routing sample, which builds sort and the bandwidth, and the recomputed report's
    evidence columns are the run's. Options given again still win."""
    import moegate.ab.__main__ as ab_main
    from moegate.ab.plan import load_run

    made = tmp_path / "made"
    synthetic_run(made)

    class RunMade:  # the driver's part is the driver tests'; here only what the command line does after it
        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            return load_run(made)

    monkeypatch.setattr(ab_main, "Driver", RunMade)
    routing = tmp_path / "routing-sample.json"
    routing.write_text(json.dumps({str(c): [[[0, 1], [0, 1]]] for c in (1, 2, 4, 8)}))  # every token on 2 experts
    shape = "--moe-shape=experts=128,top_k=8,hidden=2048,intermediate=768,layers=48"
    run_args = ["--base-python", sys.executable, "--pr-python", sys.executable, "--model", str(tmp_path / "gone")]
    run_args += ["--dataset-path", str(routing), "--out", str(made), shape, "--routing", str(routing)]
    assert cli([*run_args, "--host-sorted", "both", "--uva-peak-gbps", "40"]) == 0
    table = [line for line in (made / "report.md").read_text().splitlines() if line.startswith("| 2 |")]
    assert "routing sample" in (made / "report.md").read_text() and "UVA peak 40" in (made / "report.md").read_text()
    routing.unlink()  # the sample is gone from where it was given; the folder has its copy
    capsys.readouterr()
    assert cli(["--report-only", str(made)]) == 0
    md = (made / "report.md").read_text()
    assert "no evidence columns" not in capsys.readouterr().err
    assert [line for line in md.splitlines() if line.startswith("| 2 |")] == table
    assert "routing sample" in md and "UVA peak 40" in md and "(naive)" not in md  # both builds sort, as run
    assert cli(["--report-only", str(made), "--host-sorted", "pr"]) == 0  # given again: the option wins
    assert "(naive)" in (made / "report.md").read_text()
    kept = json.loads((made / "evidence.json").read_text())
    capsys.readouterr()
    for field, bad, said in (("shape", {"experts": 1}, "is not a MoE shape"), ("host_sorted", "all", "is none of")):
        (made / "evidence.json").write_text(json.dumps({**kept, field: bad}))
        assert cli(["--report-only", str(made)]) == 2  # a damaged folder: one line, nothing half written
        err = capsys.readouterr().err.strip()
        assert said in err and err.count("\n") == 0
