"""lab/gpu/diff_table.py, the table ``lab/gpu/diff.sh`` writes from the GPU run's ``moegate diff`` reports: FAILs
counted over the judged runs only, the false-FAIL bound where a pair must PASS, a pair judged nothing named with
its reason, and the files written whole."""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

import pytest
import torch

from lab.gpu import diff_table
from moegate.core.case import MoECase, Routing
from moegate.kernels import diff_tier
from moegate.kernels.differential import PROMISES, encode, judge, outcome


def _report(grown: float, runs: int, drawn: int = 8) -> dict:
    """A ``moegate diff`` report made by the tier's own code: ``runs`` runs whose PR error is ``grown`` times the
    base's on every case, the last run cut short (fewer than half its cases paired)."""
    outcomes: dict[int, list] = {}
    for r in range(runs):
        n = drawn if r < runs - 1 else 2
        for i in range(n):
            case = MoECase(num_tokens=6, top_k=2, num_experts=16, routing=Routing(seed=i))
            ref = torch.randn(6, 32, generator=torch.Generator().manual_seed(i))
            base = (ref + 0.01).to(torch.bfloat16)
            pr = (ref + 0.01 * grown).to(torch.bfloat16)
            b = {"inputs": "x", "path": "sorted", "output": encode(base), "reference": encode(ref)}
            b["magnitude"] = encode(ref.abs() + 1)
            outcomes.setdefault(r, []).append(outcome(r, i, case, "legacy", b, {**b, "output": encode(pr)}))
    result = diff_tier.Runs({"base": {}, "pr": {}}, list(range(runs)), [drawn] * runs, [1.0] * runs, outcomes)
    verdicts = [{p: judge(result.outcomes[i], p, drawn) for p in PROMISES} for i in range(runs)]
    opts = argparse.Namespace(base_python="/b", pr_python="/p", promise="equivalent", cases=drawn)
    return diff_tier._report(opts, result, verdicts)


def test_the_clopper_pearson_bound_of_no_fail_in_n_runs_is_one_minus_the_nth_root_of_five_percent():
    assert diff_table.upper_bound(0, 40) == pytest.approx(1 - 0.05 ** (1 / 40), rel=1e-6)
    assert diff_table.upper_bound(3, 3) == 1.0 and diff_table.upper_bound(0, 0) == 1.0
    assert 0.02 < diff_table.upper_bound(1, 100) < 0.05


def test_a_pair_row_counts_fails_over_judged_runs_and_bounds_the_false_fail_rate_where_it_must_pass(tmp_path):
    same = tmp_path / "same.json"
    same.write_text(json.dumps(_report(1.0, 4)))
    worse = tmp_path / "moe-reround.json"
    worse.write_text(json.dumps(_report(1.5, 3)))
    stub = tmp_path / "topk-order.json"
    stub.write_text(json.dumps({"runs": [], "cases": 300, "not_judged": "not judged: the base build cannot run"}))
    assert diff_table.main([str(same), str(worse), str(stub), "--out", str(tmp_path / "diff")]) == 0
    rows = {r["pair"]: r for r in json.loads((tmp_path / "diff.json").read_text())}
    assert (rows["same"]["runs"], rows["same"]["judged"]) == (4, 3)  # the last run paired 2 of 8: not judged
    assert rows["same"]["equivalent_fails"] == 0 == rows["same"]["identical_fails"]
    assert rows["same"]["equivalent_false_fail_upper"] == pytest.approx(1 - 0.05 ** (1 / 3), rel=1e-6)
    assert rows["moe-reround"]["equivalent_fails"] == 2 and "equivalent_false_fail_upper" not in rows["moe-reround"]
    assert rows["moe-reround"]["median_ratio"] > 1.4
    assert rows["topk-order"]["judged"] == 0 and rows["topk-order"]["note"].startswith("not judged")
    table = (tmp_path / "diff.md").read_text()
    assert "| same | another interpreter of the same build | 3 of 4 (8) | 0/3 (must PASS) | 0/3 (must PASS) |" in table
    assert "(not judged: the base build cannot run)" in table and not list(tmp_path.glob("*.tmp"))
    assert not math.isnan(rows["same"]["median_ratio"])


def test_a_report_that_is_not_json_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "same.json"
    bad.write_text("{")
    assert diff_table.main([str(bad), "--out", str(tmp_path / "diff")]) == 2
    assert capsys.readouterr().err.startswith(f"diff_table: {bad}: not a readable report")
    assert not (tmp_path / "diff.md").exists()


def test_every_pair_diff_sh_runs_has_its_expectation():
    script = (Path(diff_table.__file__).parent / "diff.sh").read_text()
    found = re.search(r"^pairs=\(([^)]*)\)", script, re.MULTILINE)
    assert found, "diff.sh names its pairs in one pairs=(...) line"
    assert set(found.group(1).split()) == set(diff_table.EXPECT) == {"same", "moe-reround", "topk-order", "act-fp32"}


def test_the_rate_the_cases_imply_is_holms_chance_to_reject_any_group_as_a_simulation_of_the_tier_finds():
    """The formula against the tier's own Holm step on simulated runs: groups of 40 and 25 cases, each case worse than
    the base with chance 0.45 and 0.3 (a harmless PR's shares are well under 1/2: the margin)."""
    import random

    from moegate.kernels.paired import binomial_tail, holm

    sizes, q = {"bf16 sorted": 40, "fp8 naive": 25}, {"bf16 sorted": 0.45, "fp8 naive": 0.3}
    rng, runs, fails = random.Random(7), 20_000, 0
    for _ in range(runs):
        ps = {g: binomial_tail(sum(rng.random() < q[g] for _ in range(n)), n) for g, n in sizes.items()}
        fails += bool(holm(ps))
    modelled = diff_table.run_fail_chance(sizes, q)
    assert abs(modelled - fails / runs) < 4 * math.sqrt(modelled * (1 - modelled) / runs) + 1e-4
    assert diff_table.run_fail_chance(sizes, {g: 0.5 for g in sizes}) <= diff_table.ALPHA  # H0's edge: at most alpha
    assert diff_table.run_fail_chance(sizes, {g: 0.0 for g in sizes}) == 0.0


def test_a_pair_that_must_pass_gets_the_rate_its_cases_imply_and_one_that_must_fail_does_not(tmp_path):
    same, worse = tmp_path / "same.json", tmp_path / "moe-reround.json"
    same.write_text(json.dumps(_report(1.0, 4)))
    worse.write_text(json.dumps(_report(1.5, 3)))
    assert diff_table.main([str(same), str(worse), "--out", str(tmp_path / "diff")]) == 0
    rows = {r["pair"]: r for r in json.loads((tmp_path / "diff.json").read_text())}
    assert 0.0 <= rows["same"]["modelled_false_fail"] < rows["same"]["equivalent_false_fail_upper"]
    assert "modelled_false_fail" not in rows["moe-reround"]
