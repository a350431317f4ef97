"""Running the real-bug corpus: what a gate's JUnit report says, each bug's verdict, the page, and the early stop.

- a JUnit report's failures and errors come back in run order with their tier, review checks told apart;
- a bug is killed by a behaviour failure, flagged by review checks alone, a survivor is explained by the corpus
  or fails the report, and a failing baseline voids the run;
- the stop plugin ends a real pytest run at its first failing behaviour test and runs on past a failing review
  check;
- a bug's build imports vLLM from its overlay, the re-planted file in it, the installed file untouched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from moegate.paths import ROOT
from moegate.power import corpus_run
from moegate.power.corpus import Bug, parse
from moegate.power.corpus_report import passed, render, tally, verdict
from moegate.power.corpus_run import Failure, GateResult, Plan, Runner, read_junit

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.dispatch.test_census" name="test_dispatch_sites_are_the_reviewed_ones" time="1">
  <failure message="AssertionError: vLLM 0.33.0's dispatch sites differ&#10;changed: x">tb</failure></testcase>
<testcase classname="tests.dispatch.test_dispatch_properties" name="test_path_matches_spec[legacy]" time="1"/>
<testcase classname="tests.kernels.test_kernel_census" name="test_calls_at_the_boundary[legacy-first-past]" time="2">
  <skipped message="needs 16 GiB of free GPU memory"/></testcase>
<testcase classname="tests.kernels.test_kernel_properties" name="test_output_matches_reference[modular]" time="3">
  <error message="failed on setup with &quot;RuntimeError: boom&quot;">tb</error></testcase>
<testcase classname="tests.kernels.test_kernel_properties" name="test_fp8_weights[legacy]" time="3">
  <failure message="output outside the tolerance">tb</failure></testcase>
</testsuite></testsuites>
"""


def test_a_junit_report_gives_failures_in_run_order_with_tier_and_review_told_apart(tmp_path: Path) -> None:
    path = tmp_path / "gate.xml"
    path.write_text(JUNIT)
    tests, failures, skips = read_junit(path)
    assert tests == 5
    assert [(f.nodeid, f.tier, f.review) for f in failures] == [
        ("tests/dispatch/test_census.py::test_dispatch_sites_are_the_reviewed_ones", "dispatch", True),
        ("tests/kernels/test_kernel_properties.py::test_output_matches_reference[modular]", "kernels", False),
        ("tests/kernels/test_kernel_properties.py::test_fp8_weights[legacy]", "kernels", False),
    ]
    assert failures[0].message == "AssertionError: vLLM 0.33.0's dispatch sites differ"
    assert skips == [
        "tests/kernels/test_kernel_census.py::test_calls_at_the_boundary[legacy-first-past]: needs 16 GiB of free GPU memory"
    ]


_TOML = """
[[bug]]
id = "{id}"
upstream = "vllm-project/vllm#7"
url = "https://github.com/vllm-project/vllm/pull/7"
title = "t"
what = "w"
expect = "{expect}"
survives = "{survives}"
[[bug.edit]]
file = "pkg/mod.py"
scope = "f"
find = "a"
replace = "b"
"""


def _bug(bug_id: str, expect: str = "kernels", survives: str = "") -> Bug:
    return parse(_TOML.format(id=bug_id, expect=expect, survives=survives))[0]


def _result(bug_id: str, exit_code: int | None, *failures: tuple[str, bool], status: str = "ran") -> dict[str, Any]:
    fails = [Failure(n, corpus_run.tier_of(n), review, "m") for n, review in failures]
    fingerprint = "" if bug_id == "baseline" else _bug(bug_id).fingerprint  # every _bug re-plants alike
    result = GateResult(
        bug_id, status, exit_code=exit_code, tests=9, failures=fails, wall_s=5.0, fingerprint=fingerprint
    )
    return asdict(result)


BEHAVIOUR = ("tests/kernels/test_kernel_properties.py::test_fp8_weights[legacy]", False)
REVIEW = ("tests/dispatch/test_census.py::test_dispatch_sites_are_the_reviewed_ones", True)


@pytest.mark.parametrize(
    ("result", "bug", "tiers", "want"),
    [
        (
            _result("b", 1, REVIEW, BEHAVIOUR),
            _bug("b"),
            "dispatch,kernels",
            ("killed", "kernels: `" + BEHAVIOUR[0] + "`"),
        ),
        (
            _result("b", 1, REVIEW),
            _bug("b", "survives", "why"),
            "dispatch,kernels",
            ("flagged", "review only: `" + REVIEW[0] + "`"),
        ),
        (
            _result("b", 0),
            _bug("b", "survives", "a reviewed reason"),
            "dispatch,kernels",
            ("survived", "a reviewed reason"),
        ),
        (
            _result("b", 0),
            _bug("b"),
            "dispatch,kernels",
            ("unexplained", "survived with no reviewed explanation in the corpus"),
        ),
        (_result("b", 0), _bug("b"), "dispatch", ("survived", "expected to die in the kernels tier, not run here")),
        (_result("b", None, status="timeout"), _bug("b"), "dispatch", ("not judged", "")),
        (_result("b", None, status="not-run"), _bug("b"), "dispatch", ("not run", "")),
        (_result("b", 1), _bug("b"), "dispatch", ("not judged", "gate exit 1 without a failing test: ")),
    ],
    ids=["killed", "flagged", "explained", "unexplained", "tier-not-run", "timeout", "not-run", "fail-no-test"],
)
def test_each_result_gets_its_verdict(result: dict[str, Any], bug: Bug, tiers: str, want: tuple[str, str]) -> None:
    assert verdict(result, bug, tiers) == want


def _summary(*results: dict[str, Any], tiers: str = "dispatch,kernels") -> dict[str, Any]:
    return {
        "command": "python -m moegate.power corpus run ...", "date": "2026-12-06 00:00 UTC", "project_rev": "abc1234",
        "vllm_version": "0.33.0", "device": "NVIDIA H200", "tiers": tiers, "jobs": 4, "budget_s": 3000.0,
        "stop_at_first_kill": True, "wall_s": 100.0, "corpus": "power/real-bugs.toml", "corpus_sha256": "0" * 64,
        "results": [_result("baseline", 0), *results],
    }  # fmt: skip


def test_the_page_scores_killed_over_judged_and_says_why_each_bug_was_not_killed() -> None:
    bugs = [
        _bug("k"),
        _bug("f", "survives", "only the site review sees it"),
        _bug("s", "survives", "inside the tolerance"),
        _bug("n"),
    ]
    summary = _summary(
        _result("k", 1, BEHAVIOUR), _result("f", 1, REVIEW), _result("s", 0), _result("n", None, status="not-run")
    )
    assert tally(summary, bugs) == {"killed": 1, "flagged": 1, "survived": 1, "not run": 1}
    page = render([summary], bugs)
    assert "**1 of 3 killed by behaviour (33 %)**, 1 flagged, 1 survived, 1 not run." in page
    assert "- `s` (survived): inside the tolerance" in page
    assert "- `f` (flagged): only the site review sees it" in page
    assert "| `k` | [#7](https://github.com/vllm-project/vllm/pull/7) | `mod.py::f` | kernels | **killed** |" in page
    assert passed([summary], bugs)


def test_a_result_of_a_re_plant_the_corpus_has_since_changed_is_stale_and_fails_the_report() -> None:
    result = _result("b", 1, BEHAVIOUR)
    assert verdict(result, _bug("b", "survives", "the text around the edit may change"), "dispatch")[0] == "killed"
    moved = parse(_TOML.format(id="b", expect="kernels", survives="").replace('replace = "b"', 'replace = "c"'))[0]
    assert verdict(result, moved, "dispatch,kernels")[0] == "stale"
    assert not passed([_summary(result)], [moved])


def test_a_kill_by_a_test_the_baseline_fails_too_is_not_judged_and_a_gate_never_started_is_not_run() -> None:
    """The second H100 run: the unplanted build failed one test (a crash of vLLM 0.33.0 itself), two bugs stopped
    at that same test, and the budget left five unstarted (no fingerprint: nothing was planted)."""
    other = ("tests/kernels/test_kernel_census.py::test_biases[legacy]", False)
    summary = _summary(_result("a", 1, BEHAVIOUR), _result("b", 1, other), _result("c", None, status="not-run"))
    summary["results"][0] = _result("baseline", 1, BEHAVIOUR)
    summary["results"][-1].pop("fingerprint")
    bugs = [_bug("a"), _bug("b"), _bug("c")]
    assert tally(summary, bugs) == {"not judged": 1, "killed": 1, "not run": 1}
    assert "fails on the unplanted build too" in render([summary], bugs)


def test_an_unexplained_survivor_or_a_failing_baseline_fails_the_report() -> None:
    bugs = [_bug("u")]
    assert not passed([_summary(_result("u", 0))], bugs)
    assert not passed([_summary(_result("u", 1, REVIEW))], bugs)  # flagged, and nothing says why it lived
    void = _summary(_result("u", 1, BEHAVIOUR))
    void["results"][0] = _result("baseline", 1, BEHAVIOUR)
    assert not passed([void], bugs)
    assert "(**void**: the baseline fails)" in render([void], bugs)


TESTS = {
    "tests/dispatch/test_census.py": "def test_review():\n    assert False, 'a site changed'\n",
    "tests/dispatch/test_props.py": "def test_a():\n    pass\n\ndef test_b():\n    assert False, 'wrong path'\n",
    "tests/dispatch/test_zlater.py": "def test_c():\n    pass\n",
}


def _pytest_with_the_stop_plugin(
    tmp_path: Path, files: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """A real pytest run of ``files`` (path -> source, under ``tmp_path``) with the corpus's stop plugin; its JUnit."""
    for rel, body in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    junit = tmp_path / "out.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(tmp_path),
        "-c",
        str(tmp_path / "pytest.ini"),
        "--rootdir",
        str(tmp_path),
    ]
    cmd += ["-p", "no:cacheprovider", "-p", corpus_run.STOP_PLUGIN, f"--junitxml={junit}", "-q"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False), junit  # ROOT: this moegate


@pytest.mark.parametrize("behaviour_fails", [True, False], ids=["stops", "runs-on"])
def test_the_stop_plugin_ends_a_run_at_its_first_behaviour_failure_not_at_a_review_one(
    tmp_path: Path, behaviour_fails: bool
) -> None:
    files = {
        rel: body if behaviour_fails else body.replace("assert False, 'wrong path'", "pass")
        for rel, body in TESTS.items()
    }
    proc, junit = _pytest_with_the_stop_plugin(tmp_path, files)
    ran = [f.nodeid for f in read_junit(junit)[1]], read_junit(junit)[0]
    if behaviour_fails:
        assert ran == (["tests/dispatch/test_census.py::test_review", "tests/dispatch/test_props.py::test_b"], 3), (
            proc.stdout
        )
        assert "corpus_stop" in proc.stdout
    else:
        assert ran == (["tests/dispatch/test_census.py::test_review"], 4), proc.stdout  # on past the review failure


def test_a_bugs_build_imports_vllm_from_its_overlay_and_the_installed_file_is_untouched(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "vllm" / "pkg").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "pkg" / "__init__.py").write_text("")
    (site / "vllm" / "pkg" / "mod.py").write_text("def f():\n    return 'a'\n")
    plan = Plan(vllm_python=sys.executable, sites=(str(site),), tiers="dispatch", out=tmp_path / "out")
    runner = Runner(plan, tmp_path / "work", site / "vllm")
    python, planted = runner.build(_bug("b"))
    code = "import vllm.pkg.mod as m; print(m.__file__); print(m.f())"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert out == [str(tmp_path / "work" / "b" / "overlay" / "vllm" / "pkg" / "mod.py"), "b"]
    assert planted == ["pkg/mod.py"]
    assert (site / "vllm" / "pkg" / "mod.py").read_text() == "def f():\n    return 'a'\n"
    base, _ = runner.build(None)
    out = subprocess.run([base, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert out == [str(tmp_path / "work" / "baseline" / "overlay" / "vllm" / "pkg" / "mod.py"), "a"]


def test_the_baseline_runs_every_test_and_a_bug_stops_at_its_first_failure(tmp_path: Path) -> None:
    """The baseline's failures are what a bug's first failing test is held against (the report's "not judged"):
    on the H100 the baseline stopped at its one failure, leaving its later tests unknown."""
    site = tmp_path / "site"
    (site / "vllm" / "pkg").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "pkg" / "__init__.py").write_text("")
    (site / "vllm" / "pkg" / "mod.py").write_text("def f():\n    return 'a'\n")
    plan = Plan(vllm_python=sys.executable, sites=(str(site),), tiers="dispatch", out=tmp_path / "out", timeout_s=60)
    runner = Runner(plan, tmp_path / "work", site / "vllm")
    for bug in (None, _bug("b")):
        runner.gate(bug)  # the stand-in vLLM fails the gate at once: only its command line matters here
    commands = {n: (tmp_path / "out" / n / "gate.log").read_text().splitlines()[0] for n in ("baseline", "b")}
    assert corpus_run.STOP_PLUGIN not in commands["baseline"] and corpus_run.STOP_PLUGIN in commands["b"]


def test_a_bug_whose_gate_fails_only_the_differential_tier_is_killed_by_it() -> None:
    """The corpus runs the kernels leg's diff tier against the baseline's build: an extra rounding inside the
    tolerance passes every behaviour test and is told apart only there (issue 45: the routed weight after the cast)."""
    line = "moegate gate: FAIL: vLLM 0.33.0 + b: dispatch + kernels ok (pytest exit 0); kernel floor ok (98); diff FAIL (x)"
    result = {**_result("b", 1), "error": line}
    assert verdict(result, _bug("b"), "dispatch,kernels,diff")[0] == "killed"
    assert verdict({**result, "error": "moegate gate: FAIL: kernel floor FAIL"}, _bug("b"), "dispatch,kernels")[0] == (
        "not judged"
    )


def test_the_diff_tier_gates_each_bug_against_the_baseline_build(tmp_path: Path) -> None:
    cmd = corpus_run.gate_command(
        "/b/bug/bin/python", "dispatch,kernels,diff", tmp_path / "g.xml", "x", False, "/b/base"
    )
    assert "--base-python=/b/base" in cmd and cmd.index("--base-python=/b/base") < cmd.index("--")
    # each gate's page and diff report beside its JUnit: gates side by side must not overwrite one another's
    assert {f"--page={tmp_path / 'gate.md'}", f"--diff-json={tmp_path / 'diff.json'}"} <= set(cmd[: cmd.index("--")])
    assert not any(
        a.startswith("--base-python") for a in corpus_run.gate_command("/p", "dispatch", tmp_path, "x", False)
    )
    with pytest.raises(corpus_run.CorpusError):
        corpus_run.gate_command("/p", "kernels,diff", tmp_path, "x", False)


@pytest.mark.parametrize("tiers", ["dispatch", "dispatch,kernels,diff", "kernels,diff"])
def test_the_command_line_takes_the_tiers_the_device_script_passes(tiers: str) -> None:
    """lab/gpu/corpus.sh passes ``dispatch,kernels,diff`` by default and ``kernels,diff`` where the CPU run holds the
    dispatch tier's kills; the command line refused the first (the 2026-12-06 H100 wave lost its corpus to it)."""
    from moegate.power.corpus_cli import parser

    args = parser().parse_args(["run", "--vllm-python", "p", "--out", "o", "--tiers", tiers])
    assert args.tiers == tiers
    with pytest.raises(SystemExit):
        parser().parse_args(["run", "--vllm-python", "p", "--out", "o", "--tiers", "kernels,sweep"])


def test_the_stop_plugin_runs_engine_starting_files_last_and_the_dispatch_tier_after_the_cheap_kernel_tests(
    tmp_path: Path,
) -> None:
    """A kill comes as soon as its test runs: the census's kernel tests come before minutes of engine starts."""
    names = ["tests/dispatch/test_props.py", "tests/kernels/test_cuda_graphs.py", "tests/kernels/test_kernel_x.py"]
    proc, junit = _pytest_with_the_stop_plugin(
        tmp_path, dict.fromkeys(names, "def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    )
    assert proc.returncode == 0, proc.stdout
    import xml.etree.ElementTree as ET

    ran = [f"{c.get('classname')}.{c.get('name')}" for c in ET.parse(junit).iter("testcase")]
    assert ran == [
        "tests.kernels.test_kernel_x.test_a",
        "tests.kernels.test_kernel_x.test_b",
        "tests.dispatch.test_props.test_a",
        "tests.dispatch.test_props.test_b",
        "tests.kernels.test_cuda_graphs.test_a",
        "tests.kernels.test_cuda_graphs.test_b",
    ]


def test_a_stopping_gate_runs_the_diff_tier_on_its_own_after_the_pytest_tiers_and_the_baseline_runs_one_gate() -> None:
    assert corpus_run.gate_steps("dispatch,kernels,diff", full=False) == ["dispatch,kernels", "diff"]
    assert corpus_run.gate_steps("dispatch,kernels,diff", full=True) == ["dispatch,kernels,diff"]
    assert corpus_run.gate_steps("dispatch", full=False) == ["dispatch"]
    assert corpus_run.gate_steps("diff", full=False) == ["diff"]


def test_a_bug_flagged_by_review_and_failed_by_the_diff_tier_is_killed_by_the_diff() -> None:
    failure = asdict(Failure("tests/dispatch/test_census.py::test_review", "dispatch", True, "a site changed"))
    line = "moegate gate: FAIL: vLLM 0.33.0 + b: diff FAIL (2 groups worse than the base)"
    result = {**_result("b", 1), "failures": [failure], "error": line}
    assert verdict(result, _bug("b"), "dispatch,kernels,diff")[0] == "killed"
    assert verdict({**result, "error": ""}, _bug("b"), "dispatch,kernels,diff")[0] == "flagged"


class _ScriptedRunner(Runner):
    """The runner with each ``moegate gate`` run replaced by a JUnit report and an exit status given in advance."""

    def __init__(self, tmp_path: Path, outcomes: dict[str, tuple[str, int]]) -> None:
        plan = Plan(vllm_python=sys.executable, sites=(), tiers="dispatch,kernels,diff", out=tmp_path / "out")
        super().__init__(plan, tmp_path / "work", tmp_path, version="0.33.0")
        self.outcomes: dict[str, tuple[str, int]] = outcomes
        self.ran: list[str] = []

    def build(self, bug: Bug | None) -> tuple[str, list[str]]:
        return sys.executable, []

    def _run(self, name: str, cmd: list[str], env: Any, log: Path, deadline: float) -> int | None:
        step = next(a.split("=", 1)[1] for a in cmd if a.startswith("--tiers="))
        self.ran.append(step)
        junit_xml, code = self.outcomes[step]
        if junit_xml:
            Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("--junit="))).write_text(junit_xml)
        with log.open("a") as fh:
            fh.write(f"moegate gate: {'PASS' if code == 0 else 'FAIL'}: b: {step} {'ok' if code == 0 else 'FAIL'} \n")
            fh.write("moegate gate: page: /x/reports/gate.md\n")  # the gate's last line, after its verdict
        return code


_PASSING = '<testsuites><testsuite><testcase classname="tests.kernels.test_k" name="test_a"/></testsuite></testsuites>'


@pytest.mark.parametrize(
    ("first", "diff_runs", "want"),
    [
        (JUNIT, False, "killed"),
        (_PASSING, True, "killed"),
        (
            JUNIT.replace("<failure", "<skipped")
            .replace("</failure>", "</skipped>")
            .replace("<error", "<skipped")
            .replace("</error>", "</skipped>"),
            True,
            "killed",
        ),
    ],
    ids=["behaviour-kill-no-diff", "pass-then-diff", "skips-then-diff"],
)
def test_a_stopping_gate_skips_the_diff_tier_after_a_behaviour_kill_and_runs_it_otherwise(
    tmp_path: Path, first: str, diff_runs: bool, want: str
) -> None:
    runner = _ScriptedRunner(tmp_path, {"dispatch,kernels": (first, 0 if first is not JUNIT else 1), "diff": ("", 1)})
    res = runner.gate(_bug("b"))
    assert runner.ran == (["dispatch,kernels", "diff"] if diff_runs else ["dispatch,kernels"])
    assert verdict(asdict(res), _bug("b"), "dispatch,kernels,diff")[0] == want
    if diff_runs:
        assert res.exit_code == 1 and " diff FAIL " in f" {res.error} "
    else:
        assert "diff: not run" in (tmp_path / "out" / "b" / "gate.log").read_text()


def test_the_verdict_line_is_the_gates_verdict_not_its_last_line(tmp_path: Path) -> None:
    """The gate prints its page's path after its verdict: the 2026-12-06 H100 corpus read that path as the verdict,
    and a bug its diff tier failed came out "not judged"."""
    log = tmp_path / "gate.log"
    log.write_text(
        "moegate gate: PASS: vLLM 0.33.0 + b: dispatch + kernels ok (pytest exit 0)\n"
        "moegate gate: page: /x/reports/gate.md\n"
        "moegate diff: seed 0: FAIL (identical): 167 of 300 cases differ\n"
        "moegate gate: FAIL: vLLM 0.33.0 + b: diff FAIL (exit 1, no failing test named)\n"
        "moegate gate: page: /x/reports/gate.md\n"
    )
    assert (
        corpus_run.verdict_line(log) == "moegate gate: FAIL: vLLM 0.33.0 + b: diff FAIL (exit 1, no failing test named)"
    )
    log.write_text("moegate gate: page: /x/reports/gate.md\n")
    assert corpus_run.verdict_line(log) == "no verdict line in the log"


def test_a_rescan_reads_each_gate_again_from_its_log_and_junit_and_says_so_on_the_page(tmp_path: Path) -> None:
    from moegate.power.corpus_rescan import rescan

    bug = _bug("b")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "gate.log").write_text(
        "moegate gate: FAIL: vLLM 0.33.0 + b: diff FAIL (exit 1, no failing test named)\n"
        "moegate gate: page: /x/reports/gate.md\n"
    )
    (tmp_path / "b" / "gate.xml").write_text(_PASSING)
    recorded = {**_result("b", 1), "error": "moegate gate: page: /x/reports/gate.md", "tests": 0}
    summary = {
        "command": "c", "date": "d", "project_rev": "unknown", "vllm_version": "0.33.0", "device": "GPU",
        "tiers": "dispatch,kernels,diff", "jobs": 1, "budget_s": 10.0, "stop_at_first_kill": True, "wall_s": 1.0,
        "corpus": "power/real-bugs.toml", "corpus_sha256": "0" * 64, "results": [_result("baseline", 0), recorded],
    }  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert verdict(recorded, bug, "dispatch,kernels,diff")[0] == "not judged"  # as the run read itself
    out = rescan(tmp_path, project_rev="abc1234")
    again = out["results"][1]
    assert verdict(again, bug, "dispatch,kernels,diff")[0] == "killed" and again["tests"] == 1
    assert json.loads((tmp_path / "b" / "result.json").read_text()) == again
    assert out["project_rev"] == "abc1234" and out["results"][1]["exit_code"] == 1  # what ran is not changed
    assert "Read again from each gate's log and JUnit report" in (tmp_path / "summary.md").read_text()


def test_a_failing_test_in_a_test_class_keeps_pytests_node_id(tmp_path: Path) -> None:
    """The corpus reads ids as the gate's page does (moegate.core.junit.nodeid): a kill in a ``Test*`` class, and
    the baseline's same failure, must be the same id for "not judged" to see it."""
    path = tmp_path / "gate.xml"
    path.write_text(
        '<testsuites><testsuite><testcase classname="tests.kernels.test_k.TestBias" name="test_a[p]">'
        '<failure message="off">tb</failure></testcase></testsuite></testsuites>'
    )
    assert [f.nodeid for f in read_junit(path)[1]] == ["tests/kernels/test_k.py::TestBias::test_a[p]"]
