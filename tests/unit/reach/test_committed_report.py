"""The committed reach report holds: what the census's configurations require is exercised or has a reviewed reason.

Read from the checkout alone (no vLLM, no GPU): the measured records in ``results/reach/``, the census golden of
their release, ``reach/reasons.toml``. The judgement is recomputed here (``moegate.reach.evaluate``), so a reason
edited, a record replaced or a census changed without regenerating the page fails too (the last test). The
kernel tier's requirements are judged once a GPU record is committed (``lab/gpu/reach.sh``); until then they
are skipped with that reason, never passed.
"""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import pytest

from moegate.census import census
from moegate.paths import RESULTS_DIR
from moegate.reach import evaluate, reasons
from moegate.reach import requirements as rq
from moegate.reach.__main__ import committed_records, read_record
from moegate.reach.__main__ import main as reach_main

RECORDS = committed_records(RESULTS_DIR / "reach")


@functools.cache
def inputs() -> tuple[evaluate.Measured, list[dict[str, Any]], list[reasons.Reason]]:
    if not RECORDS:
        pytest.fail("no measured record in results/reach/: python -m moegate.reach run, then report")
    measured = evaluate.combine([json.loads(read_record(p)) for p in RECORDS])
    return measured, census.parse_golden(census.golden_path(measured.vllm).read_text()), reasons.load()


def judged(measured: evaluate.Measured | None = None) -> evaluate.Evaluation:
    m, records, why = inputs()
    return evaluate.evaluate(measured or m, records, why)


def test_the_records_measure_the_dispatch_tier_of_one_release_with_a_census():
    measured, records, _ = inputs()
    assert "dispatch" in measured.tiers and len(measured.functions) > 1000
    assert rq.features(records)["triton"]


def test_every_census_requirement_of_a_measured_tier_is_exercised_or_has_a_reviewed_reason():
    problems = [p for p in judged().problems if p.startswith("not exercised")]
    assert not problems, "\n".join(problems)


def test_every_branch_judged_is_taken_or_has_a_reviewed_reason():
    problems = [p for p in judged().problems if p.startswith("branch")]
    assert not problems, f"{len(problems)} branches:\n" + "\n".join(problems[:50])


def test_every_census_reason_holds_and_every_reason_covers_something():
    problems = [p for p in judged().problems if p.startswith("reasons.toml")]
    assert not problems, "\n".join(problems)


def test_the_kernel_tiers_requirements_are_measured():
    pending = judged().pending
    if pending:
        pytest.skip(
            f"{len(pending)} kernel-tier requirements not measured: no GPU record in results/reach/ "
            "(bash lab/gpu/reach.sh RESULT_DIR on the device, then python -m moegate.reach report)"
        )


def test_a_required_function_the_records_lose_would_fail_the_report():
    """The control: the same judgement on the committed records, less one required function, names it."""
    measured = copy.deepcopy(inputs()[0])
    lost = f"{rq.FM}::_prepare_expert_assignment"
    measured.functions[lost]["executed"] = []
    assert any(p.startswith(f"not exercised, no reason: function:{lost}") for p in judged(measured).problems)


def test_the_committed_page_is_what_the_command_makes_now(capsys):
    status = reach_main(["report", "--check"])
    assert status == 0, capsys.readouterr().err + " (regenerate: python -m moegate.reach report)"
