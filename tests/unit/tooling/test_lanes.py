"""The test command's parallel lanes (tooling/lanes.py): the plan, the totals it prints, and its exit status."""

from __future__ import annotations

import pytest

from tooling import lanes

LOG_A = """\
nox > Running session unit(3.12)
tests/unit/test_case.py ....                                             [100%]
================= 417 passed, 6 skipped, 2 deselected in 61.02s (0:01:01) ==================
nox > Session unit(3.12) was successful in a minute.
"""
LOG_B = """\
============================== 1 failed, 32 passed in 18.40s ===============================
=========================== 4 passed, 1 error in 3.10s ============================
"""


def test_the_plan_puts_the_longest_sessions_first_each_on_the_least_loaded_lane():
    durations = {"e2e": 400.0, "ab": 200.0, "unit-a": 70.0, "unit-b": 70.0, "lint": 40.0, "meta": 90.0}
    plan = lanes.plan(list(durations), 2, durations)
    assert plan == [["e2e", "lint"], ["ab", "meta", "unit-a", "unit-b"]]
    loads = [sum(durations[s] for s in lane) for lane in plan]
    assert loads == [440.0, 430.0]  # the longest lane is what the wall time will be (the sum is 870)


def test_every_session_is_planned_once_whatever_the_lane_count():
    names = ["a", "b", "c", "d", "e"]
    for n in (1, 2, 3, 8):
        plan = lanes.plan(names, n, {})
        assert sorted(s for lane in plan for s in lane) == names
        assert len(plan) == min(n, len(names))
    assert lanes.plan(names, 1, {}) == [names]  # one lane: nox -t tests' own order


def test_pytest_totals_add_up_every_closing_line():
    assert lanes.pytest_totals(LOG_A) == {"passed": 417, "skipped": 6, "deselected": 2}
    assert lanes.pytest_totals(LOG_B) == {"failed": 1, "passed": 36, "errors": 1}
    assert lanes.pytest_totals("nox > Session lint was successful in 14 seconds.") == {}


def test_the_summary_ends_on_the_plain_closing_line_and_fails_when_a_session_failed():
    ok = lanes.Outcome("unit(3.12)", 0, 0, 61.0, LOG_A)
    bad = lanes.Outcome("dispatch", 1, 1, 18.4, LOG_B)
    text, passed = lanes.summary([ok, bad], 80.0)
    assert not passed and "FAILED" in text
    assert text.splitlines()[-1] == "tests: 453 passed, 1 failed, 6 skipped, 1 errors"
    assert lanes.summary([ok], 61.0)[1]


def test_an_unknown_session_fails_the_command_with_noxs_own_message(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(lanes, "times_file", lambda: tmp_path / "lane-times.json")
    assert lanes.main(["no-such-session", "--lanes", "2"]) == 1
    out = capsys.readouterr().out
    assert "no-such-session: FAILED" in out and "tests: 0 passed, 0 failed" in out


def test_a_lane_count_below_one_is_refused_in_one_line(capsys):
    assert lanes.main(["--lanes", "0"]) == 2
    assert capsys.readouterr().err.strip() == "tooling.lanes: --lanes must be >= 1, got 0"


@pytest.mark.parametrize("bad", ["{not json", '["a list"]'])
def test_a_broken_times_file_falls_back_to_the_expected_durations(tmp_path, bad):
    path = tmp_path / "lane-times.json"
    path.write_text(bad)
    assert lanes.load_times(path) == lanes.EXPECTED_S


def test_a_failed_session_keeps_the_longer_of_its_time_and_the_time_before():
    before = {"unit-shard(1)": 70.0, "e2e-smoke": 300.0, "lint": 25.0}
    outcomes = [
        lanes.Outcome("unit-shard(1)", 0, 1, 466.0, ""),  # failed late: its time is the better guess
        lanes.Outcome("e2e-smoke", 1, 1, 12.0, ""),  # failed early: the time before stays
        lanes.Outcome("lint", 1, 0, 20.0, ""),  # passed: its own time, shorter or not
    ]
    assert lanes.recorded_times(before, outcomes) == {"unit-shard(1)": 466.0, "e2e-smoke": 300.0, "lint": 20.0}
