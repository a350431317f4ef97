"""First-token outliers in an A/B run's measured sweeps (moegate/ab/stalls.py), on run folders written
by the driver with stand-in servers and vLLM-shaped result dicts edited where a test needs an outlier."""

from __future__ import annotations

from moegate.ab import report
from moegate.ab.stalls import STALL_MS, outliers
from tests.support.ab import StubBench, make_driver, reset_stubs, set_result_fields, tok_s  # noqa: F401 (autouse)


def _run_with_ttfts(tmp_path, ttfts):
    """A 2-round run at c=1, 2; ``ttfts[(start index, c)] = (median, p99)`` written into its result JSONs
    (every other run: median 80 ms, p99 120 ms)."""
    run = make_driver(tmp_path, StubBench(tok_s), starts=2, levels=(1, 2)).run()
    fields = {k: {"median_ttft_ms": m, "p99_ttft_ms": p} for k, (m, p) in ttfts.items()}
    return set_result_fields(tmp_path / "run", run, (1, 2), fields, {"median_ttft_ms": 80.0, "p99_ttft_ms": 120.0})


def test_a_late_first_token_and_a_uniformly_slow_run_are_named_and_ordinary_runs_are_not(tmp_path):
    run = _run_with_ttfts(tmp_path, {(0, 1): (82.0, 82.0 + STALL_MS + 100), (2, 2): (775.0, 843.0)})
    found = outliers(run, tmp_path / "run")
    assert [(o.start, o.concurrency, o.kind) for o in found] == [(1, 1, "stall"), (3, 2, "slow first tokens")]
    assert "600 ms after the run's median" in found[0].describe()
    assert "10x the level's 80 ms" in found[1].describe()


def test_nothing_is_named_just_under_the_thresholds(tmp_path):
    run = _run_with_ttfts(tmp_path, {(0, 1): (82.0, 82.0 + STALL_MS - 1), (2, 2): (319.0, 330.0)})
    assert outliers(run, tmp_path / "run") == []


def test_the_report_names_the_outliers_and_a_run_without_result_files_still_renders(tmp_path):
    run = _run_with_ttfts(tmp_path, {(1, 2): (90.0, 1200.0)})
    text = report.write(run, tmp_path / "run", with_plot=False).markdown
    assert "**First-token outliers** (1 measured runs" in text and "start 2 (pr) at c=2" in text
    for f in (tmp_path / "run" / "starts").rglob("measured-c*.json"):
        f.unlink()
    assert outliers(run, tmp_path / "run") == []
    assert "First-token outliers" not in report.write(run, tmp_path / "run", with_plot=False).markdown
