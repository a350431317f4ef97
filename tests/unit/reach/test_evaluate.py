"""The report's judgement on small measured records: what fails it, what a reason settles, what waits for a GPU."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from moegate.kernels.conditions import INDEX_BOUNDARY
from moegate.kernels.reference import W2_BIAS, W13_BIAS
from moegate.reach import evaluate, reasons
from moegate.reach import requirements as rq

LAYER = {"kind": "layer", "file": "models/m.py", "scope": "M.__init__", "activation": {"activation": "silu"},
         "bias": {"has_bias": True}, "routing": {}, "ep": {}, "values": {}, "shared": {}, "shape": {}}  # fmt: skip
CENSUS = [LAYER]
FUNCTIONS = [i.key for i in rq.TRITON if i.kind == "function"]


def record(tiers: list[str], reached: list[str] = FUNCTIONS, **extra: Any) -> dict[str, Any]:
    """A measured record: every listed function reached, with one branch taken and one not."""
    functions = {
        key: {"executed": [1, 2] if key in reached else [], "statements": 3, "arcs": [[1, 2, 1], [1, 3, 0]],
              "text": {"1": "if current_platform.is_rocm():" if key.endswith("fused_experts") else "if flag:"}}
        for key in FUNCTIONS
    }  # fmt: skip
    rec = {"vllm": "0.33.0", "tiers": tiers, "device": "cpu", "profile": "ci", "pytest_exit": 0, "seconds": 1.0,
           "functions": functions, "triton_kernels": [], "specialisations": None, "conditions": None}  # fmt: skip
    rec.update(extra)
    return rec


COVERS_ALL_UNTAKEN = reasons.parse('[[reason]]\nkind = "scope"\nwhy = "test"\nwhere = ["*"]\nline = "if flag:"\n')


def judge(*recs: dict[str, Any], why: list[reasons.Reason] | None = None) -> evaluate.Evaluation:
    return evaluate.evaluate(evaluate.combine(list(recs)), CENSUS, why if why is not None else COVERS_ALL_UNTAKEN)


def test_the_dispatch_tier_alone_judges_its_requirements_and_the_decisions_branches_and_waits_for_the_rest():
    ev = judge(record(["dispatch"]))
    decision = [p for p in ev.problems if any(d in p for d in evaluate.DECISION)]
    assert ev.problems == decision == []  # the decision's untaken arc is covered by the reason
    assert any(p.startswith(f"condition:{INDEX_BOUNDARY}") for p in ev.pending)
    assert not ev.complete


def test_a_required_function_no_run_reached_fails_the_report_unless_a_reason_covers_it():
    missing = rq.TRITON[0].key
    ev = judge(record(["dispatch"], reached=FUNCTIONS[1:]))
    assert [p for p in ev.problems if "not exercised, no reason" in p] == [
        f"not exercised, no reason: function:{missing} (required by triton; 0 lines ran)"
    ]
    why = COVERS_ALL_UNTAKEN + reasons.parse(f'[[reason]]\nkind = "scope"\nwhy = "x"\nitems = ["function:{missing}"]\n')
    assert judge(record(["dispatch"], reached=FUNCTIONS[1:]), why=why).problems == []


def test_once_every_tier_is_measured_an_untaken_branch_of_a_reached_function_needs_a_reason():
    kernels = record(["dispatch", "kernels"], specialisations=[], conditions={})
    ev = judge(kernels, why=[])
    assert sum("branch not taken, no reason" in p for p in ev.problems) == len(FUNCTIONS)
    rocm = reasons.parse('[[reason]]\nkind = "hardware"\nwhy = "ROCm"\nwhere = ["*"]\nline = "is_rocm"\n')
    ev = judge(kernels, why=rocm)
    assert sum("branch not taken, no reason" in p for p in ev.problems) == len(FUNCTIONS) - 1
    assert not ev.pending and ev.complete


def test_kernel_requirements_are_met_by_variants_and_by_conditions_that_mattered():
    variants = [{"kernel": rq.KERNEL, "flags": {"naive_block_assignment": v, "MUL_ROUTED_WEIGHT": v, "HAS_BIAS": v},
                 "divisible": [], "types": {}, "ones": []} for v in (True, False)]  # fmt: skip
    counts = {c: {"applied": 3, "mattered": 1, "example": None} for c in (INDEX_BOUNDARY, W13_BIAS, W2_BIAS)}
    kernels = record(["dispatch", "kernels"], specialisations=variants, conditions=counts)
    ev = judge(kernels)
    unmet = [s.item.label for s in ev.items if not s.exercised]
    assert unmet == [], unmet
    counts[W2_BIAS]["mattered"] = 0  # applied, but never made to matter: a path run without telling anything
    ev = judge(kernels)
    assert [p for p in ev.problems if "not exercised" in p] == [
        f"not exercised, no reason: condition:{W2_BIAS} (required by bias; mattered in 0 of 3 cases it applied to)"
    ]


def test_a_census_reason_the_census_contradicts_and_a_reason_covering_nothing_fail_the_report():
    wrong = reasons.parse('[[reason]]\nkind = "census"\nwhy = "no biases"\nwhere = ["nowhere.py"]\n'
                          'absent = {kind = "layer", "bias.has_bias" = true}\n')  # fmt: skip
    ev = judge(record(["dispatch"]), why=COVERS_ALL_UNTAKEN + wrong)
    assert any("says the census lists no" in p and "layer models/m.py" in p for p in ev.problems)
    assert any("covers nothing the report lists: no biases" in p for p in ev.problems)


def test_records_of_two_releases_are_not_one_report():
    other = copy.deepcopy(record(["dispatch"]))
    other["vllm"] = "0.32.0"
    with pytest.raises(evaluate.MeasuredError, match="different vLLM releases"):
        evaluate.combine([record(["dispatch"]), other])
