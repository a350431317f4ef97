"""Decode time a token in an A/B run (moegate/ab/latency.py), on run folders written by the driver with
stand-in servers, their vLLM-shaped result dicts given the median time per output token a test needs."""

from __future__ import annotations

import json

import pytest

from moegate.ab import report
from moegate.ab.latency import decode_times
from tests.support.ab import StubBench, make_driver, reset_stubs, set_result_fields, tok_s  # noqa: F401 (autouse)


def _run_with_tpots(tmp_path, tpots, default=None):
    """A 2-round run at c=1, 2 (starts 0 and 3 base, 1 and 2 PR); ``tpots[(start index, c)]`` is written as
    the run's ``median_tpot_ms``; every other run gets ``default`` (None: no such field, as before vLLM kept it)."""
    run = make_driver(tmp_path, StubBench(tok_s), starts=2, levels=(1, 2)).run()
    assert [s.role for s in run.starts] == ["base", "pr", "pr", "base"]
    fields = {k: {"median_tpot_ms": v} for k, v in tpots.items()}
    return set_result_fields(
        tmp_path / "run", run, (1, 2), fields, {} if default is None else {"median_tpot_ms": default}
    )


def test_each_level_has_both_builds_decode_times_and_the_prs_speedup_over_the_geometric_means(tmp_path):
    run = _run_with_tpots(tmp_path, {(0, 2): 12.0, (3, 2): 12.0, (1, 2): 10.0, (2, 2): 10.0}, default=8.0)
    levels = decode_times(run, tmp_path / "run")
    assert [(d.concurrency, d.base, d.pr) for d in levels] == [
        (1, (8.0, 8.0), (8.0, 8.0)),
        (2, (12.0, 12.0), (10.0, 10.0)),
    ]
    assert levels[0].speedup == pytest.approx(0.0)
    assert levels[1].speedup == pytest.approx(0.2)
    assert report.describe_decode(levels[1]) == "c=2: base 12.0, PR 10.0 (+20%)"


def test_a_slower_pr_reads_as_a_negative_speedup_and_ranges_show_the_spread(tmp_path):
    run = _run_with_tpots(tmp_path, {(0, 1): 6.8, (3, 1): 10.3, (1, 1): 10.0, (2, 1): 12.0}, default=9.0)
    c1 = decode_times(run, tmp_path / "run")[0]
    assert c1.speedup is not None and c1.speedup < 0
    assert report.describe_decode(c1).startswith("c=1: base 6.8–10.3, PR 10.0–12.0 (-")


def test_runs_without_the_statistic_are_left_out_and_one_sided_levels_have_no_speedup(tmp_path):
    run = _run_with_tpots(tmp_path, {(1, 2): 10.0})
    (level,) = decode_times(run, tmp_path / "run")
    assert (level.concurrency, level.base, level.pr, level.speedup) == (2, (), (10.0,), None)
    assert report.describe_decode(level) == "c=2: base –, PR 10.0"


def test_the_report_and_verdict_json_carry_the_decode_times_and_an_old_run_renders_without_them(tmp_path):
    run = _run_with_tpots(tmp_path, {(0, 2): 12.0, (3, 2): 12.0, (1, 2): 10.0, (2, 2): 10.0}, default=8.0)
    text = report.write(run, tmp_path / "run", with_plot=False).markdown
    assert "**Decode time a token**" in text and "c=2: base 12.0, PR 10.0 (+20%)" in text
    saved = json.loads((tmp_path / "run" / report.VERDICT_JSON).read_text())
    assert saved["decode_ms"]["2"] == {"base": [12.0, 12.0], "pr": [10.0, 10.0], "speedup": pytest.approx(0.2)}
    old = _run_with_tpots(tmp_path / "old", {})
    assert decode_times(old, tmp_path / "old" / "run") == []
    assert "Decode time a token" not in report.write(old, tmp_path / "old" / "run", with_plot=False).markdown
    assert "decode_ms" not in json.loads((tmp_path / "old" / "run" / report.VERDICT_JSON).read_text())
