"""The verdict's rule (tooling/ci/run_check.py): a run passes only when it did at least what the policy asks.

Each test starts from a run of the example caller as committed (examples/vllm-caller.yml, its jobs as GitHub lists
them: ``tooling.ci_replay.verdict_cases.run_jobs``) and changes one thing a pull request could change.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

import pytest

from tests.support import ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed here (the unit env has it: nox -s unit)")

from tooling.ci import run_check
from tooling.ci.gate_plan import leg_says
from tooling.ci.moe_paths import read_list
from tooling.ci.policy import parse
from tooling.ci.run_check import GPU_JOB, Job, Label, RunRecord, judge
from tooling.ci_replay.verdict_cases import OTHER_REF, PIN, run_jobs

POLICY = parse((ROOT / "examples" / "moegate-policy.yml").read_text())
CALLER = yaml.safe_load((ROOT / "examples" / "vllm-caller.yml").read_text())
HEAD = "b" * 40
MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"


def _run(caller=None, tiers="dispatch,kernels,e2e,ab", promise="identical", changed=(MOE,), **kw) -> RunRecord:
    caller = caller or CALLER
    fields: dict[str, Any] = {
        "path": ".github/workflows/moegate.yml",
        "event": "pull_request",
        "head_sha": HEAD,
        "referenced": ((f"your-org/moegate/.github/workflows/moegate.yml@{PIN}", PIN),),
        "caller": caller,
        "jobs": tuple(
            Job(j["name"], j["conclusion"], tuple(j["labels"]), j["html_url"])
            for j in run_jobs(caller, {"tiers": tiers, "promise": promise})
        ),
        "changed": changed,
        "moe_paths": tuple(read_list()),
    }
    fields.update(kw)
    return RunRecord(**fields)


def _edited(edit) -> dict:
    caller = copy.deepcopy(CALLER)
    edit(caller)
    return caller


def test_the_example_callers_full_run_on_a_moe_change_passes():
    verdict = judge(POLICY, _run())
    assert verdict.passed, verdict.reasons
    assert verdict.headline() == (f"PASS: 1 of 1 changed files reach the fused MoE ({MOE}): dispatch, kernels, e2e, ab")


def test_a_docs_only_change_owes_the_dispatch_tier_alone_and_says_so():
    verdict = judge(POLICY, _run(tiers="dispatch", changed=("docs/usage.md", "README.md")))
    assert verdict.passed, verdict.reasons
    assert verdict.notes[0] == (
        "none of the 2 changed files reaches the fused MoE (the census's paths): the dispatch tier alone"
    )


def test_changed_files_that_could_not_all_be_listed_owe_every_tier():
    assert not judge(POLICY, _run(tiers="dispatch", changed=None)).passed
    assert judge(POLICY, _run(changed=None)).passed


@pytest.mark.parametrize(
    ("run", "says"),
    [
        (lambda: _run(path=".github/workflows/other.yml"), "the run is of .github/workflows/other.yml, not the caller"),
        (lambda: _run(referenced=()), "the run called no your-org/moegate/.github/workflows/moegate.yml"),
        (
            lambda: _run(referenced=(("your-org/moegate/.github/workflows/moegate.yml@main", OTHER_REF),)),
            f"the run called moegate at {OTHER_REF[:12]}, not at a commit the policy pins",
        ),
        (
            lambda: _run(referenced=(*_run().referenced, ("evil/x/.github/workflows/y.yml@v1", "c" * 40))),
            "the run called evil/x/.github/workflows/y.yml, which the policy does not know",
        ),
        (lambda: _run(tiers="dispatch"), "GPU leg kernels-pr did not run"),
        (lambda: _run(tiers="dispatch,kernels"), "GPU leg e2e-trained-base-vs-pr did not run"),
        (
            lambda: _run(_edited(lambda c: c["jobs"].update(verdict={"name": "moegate / moegate verdict"}))),
            "job 'verdict' of the caller is not one of the policy's",
        ),
        (
            lambda: _run(_edited(lambda c: c["jobs"]["wheels"].update(name="moegate / gpu kernels-pr: x"))),
            "job 'wheels' is named 'moegate / gpu kernels-pr: x'",
        ),
        (
            lambda: _run(_edited(lambda c: c["jobs"]["wheels"].update(name="${{ github.head_ref }}"))),
            "a name made at run time",
        ),
        (
            lambda: _run(_edited(lambda c: c["jobs"]["moegate"]["with"].update({"moegate-ref": OTHER_REF}))),
            f"moegate-ref is '{OTHER_REF}', not a commit the policy pins",
        ),
        (
            lambda: _run(_edited(lambda c: c["jobs"]["changes"].update(uses="o/r/.github/workflows/w.yml@x"))),
            "job 'changes' calls a workflow",
        ),
        (lambda: _run(promise="equivalent"), "promised equivalent without the moegate-equivalent label"),
    ],
)
def test_a_run_that_did_less_fails_with_the_reason(run, says):
    verdict = judge(POLICY, run())
    assert not verdict.passed
    assert any(says in r for r in verdict.reasons), verdict.reasons


def _jobs_where(run: RunRecord, pick, **change) -> RunRecord:
    return dataclasses.replace(run, jobs=tuple(dataclasses.replace(j, **change) if pick(j) else j for j in run.jobs))


def test_each_failing_leg_is_named_with_a_link_to_its_job():
    run = _jobs_where(_run(), lambda j: "e2e-random" in j.name, conclusion="failure")
    reasons = judge(POLICY, run).reasons
    leg = next(j for j in run.jobs if "e2e-random" in j.name)
    assert f"GPU leg e2e-random-base-vs-pr: failure ({leg.url})" in reasons


def test_a_failed_wheels_job_is_named_first_and_moegates_skipped_call_leaves_every_leg_missing():
    run = _run(jobs=tuple(Job(j["name"], j["conclusion"], tuple(j["labels"]), j["html_url"])
                          for j in run_jobs(CALLER, {"tiers": "dispatch,kernels,e2e,ab", "promise": "identical"},
                                            {"wheels": "failure"})))  # fmt: skip
    assert [(j.name, j.conclusion) for j in run.jobs] == [
        ("paths that reach the fused MoE", "success"),
        ("base and PR wheels", "failure"),
        ("moegate", "skipped"),
    ]
    verdict = judge(POLICY, run)
    assert verdict.headline() == (
        "FAIL: the caller's job 'wheels' (base and PR wheels): failure "
        "(https://github.com/vllm-project/vllm/actions/runs/4242/job/9001)"
    )
    assert "GPU leg kernels-pr did not run" in verdict.reasons


def test_legs_on_other_runners_or_with_looser_settings_fail():
    run = _jobs_where(_run(), lambda j: "kernels-pr" in j.name, labels=("self-hosted", "gpu", "a10"))
    assert any("without linux, x64, rtx4090" in r for r in judge(POLICY, run).reasons)
    run = _jobs_where(_run(), lambda j: j.name.endswith("gpu ab-base-vs-pr: gating at 0.03"),
                      name="moegate / gpu ab-base-vs-pr: advisory")  # fmt: skip
    assert "GPU leg ab-base-vs-pr was advisory; the policy has the A/B gate" in judge(POLICY, run).reasons
    run = _jobs_where(
        _run(), lambda j: "gpu ab-base-vs-pr" in j.name, name="moegate / gpu ab-base-vs-pr: gating at 0.1"
    )
    assert any("gated at 0.1; the policy's threshold is 0.03" in r for r in judge(POLICY, run).reasons)
    run = _jobs_where(
        _run(), lambda j: "gpu kernels-pr" in j.name, name="moegate / gpu kernels-pr: at least 5 kernel tests"
    )
    assert any("asked for 5 kernel tests; the policy's floor is 40" in r for r in judge(POLICY, run).reasons)


LABEL = Label(actor="a-maintainer", permission="write", sha=HEAD, at="2026-12-06T10:05:00Z")


def test_equivalent_passes_only_with_a_writers_label_at_this_head_and_says_who_and_where():
    verdict = judge(POLICY, _run(promise="equivalent", label=LABEL))
    assert verdict.passed, verdict.reasons
    assert f"moegate-equivalent: applied by a-maintainer (write) at {HEAD[:12]}, 2026-12-06T10:05:00Z" in verdict.notes
    earlier = dataclasses.replace(LABEL, sha="a" * 40)
    assert judge(POLICY, _run(promise="equivalent", label=earlier)).reasons == [
        (
            f"the moegate-equivalent label was applied by a-maintainer at {'a' * 12}; this run is at {HEAD[:12]}: "
            "a later push drops it (apply it again at this head)"
        )
    ]
    reader = dataclasses.replace(LABEL, actor="someone", permission="read")
    assert judge(POLICY, _run(promise="equivalent", label=reader)).reasons == [
        "the moegate-equivalent label was applied by someone, who has read access, not write"
    ]
    never = dataclasses.replace(POLICY, equivalent="never")
    assert "the policy allows only identical" in judge(never, _run(promise="equivalent", label=LABEL)).reasons[0]


def test_in_a_merge_queue_the_label_is_held_to_the_pull_requests_head():
    queued = _run(promise="equivalent", label=LABEL, event="merge_group", head_sha="c" * 40, pr_head=HEAD)
    assert judge(POLICY, queued).passed


# --- the names the rule reads are the reusable workflow's ---------------------------------


def test_the_job_names_the_rule_reads_are_the_reusable_workflows():
    jobs = yaml.safe_load((ROOT / ".github" / "workflows" / "moegate.yml").read_text())["jobs"]
    assert jobs["dispatch"]["name"] == run_check.DISPATCH_JOB
    assert jobs["meta"]["name"] == run_check.META_JOB
    assert jobs["verdict"]["name"] == run_check.INNER_VERDICT_JOB
    assert jobs["gpu"]["name"] == "gpu ${{ matrix.leg }}: ${{ matrix.says }}"
    assert GPU_JOB.match("gpu kernels-pr: at least 40 kernel tests")


@pytest.mark.parametrize("tier", ["kernels", "e2e", "ab"])
def test_what_each_leg_says_the_rule_reads_back(tier):
    for settings in (
        {},
        {"promise": "equivalent", "ab_gate": False, "min_kernel_tests": 7},
        {"ab_gate_threshold": 0.05},
    ):
        says = leg_says(tier, **settings)
        assert run_check.SAYS[tier].match(says), says
        assert re.fullmatch(r"[\w .-]+", says)
