"""The differential tier's verdict (``moegate.kernels.differential``): each clause on outcomes built from payloads
as the workers send them, the nondeterministic paths named in one place, the margin's derivation, the digests."""

from __future__ import annotations

import math
import shlex
from dataclasses import replace
from typing import Any

import pytest
import torch

from moegate.core.case import MoECase, Quant, Routing
from moegate.kernels import differential as d
from moegate.kernels.check import KernelResult
from moegate.kernels.inputs import WeightBank
from moegate.kernels.tolerance import Closeness, rounding_count


def _case(i: int, **kw: Any) -> MoECase:
    fields = {"num_tokens": 8, "top_k": 2, "num_experts": 16, "hidden": 128, "intermediate": 128, **kw}
    return MoECase(routing=Routing(seed=i), **fields)


def _payloads(ref: torch.Tensor, base: torch.Tensor, pr: torch.Tensor, inputs: tuple[str, str] = ("x", "x")):
    mag = ref.abs() + 1.0
    b = {"inputs": inputs[0], "path": "sorted", "output": d.encode(base)}
    b |= {"reference": d.encode(ref), "magnitude": d.encode(mag)}
    return b, {"inputs": inputs[1], "path": "sorted", "output": d.encode(pr)}


def _outcomes(n: int, same: bool, *, case: MoECase | None = None, seed: int = 0, entrypoint: str = "legacy"):
    """``n`` cases whose base output is the reference plus an error of bfloat16's size; the PR's is the same output
    (``same``) or another draw of such an error (outputs differ, errors alike: a reordered sum)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        c = case or _case(i)
        ref = torch.randn(8, 128, generator=gen)
        base = (ref + 0.01 * torch.randn(8, 128, generator=gen)).to(torch.bfloat16)
        pr = base if same else (ref + 0.01 * torch.randn(8, 128, generator=gen)).to(torch.bfloat16)
        out.append(d.outcome(0, i, c, entrypoint, *_payloads(ref, base, pr)))
    return out


def test_the_margin_is_the_midpoint_of_no_change_and_one_extra_rounding_in_the_largest_error_budget():
    assert d.BUDGET == rounding_count(torch.bfloat16, Quant("int4_w4a16", 128)) // 2 + 1  # ROUNDINGS + 8 + 1 = 13
    assert d.ONE_ROUNDING == pytest.approx(math.sqrt(1 + 1 / 13))
    assert d.MIN_RATIO**2 == pytest.approx(d.ONE_ROUNDING) and 1.018 < d.MIN_RATIO < 1.019


def test_outputs_and_references_travel_as_plain_bytes_and_come_back_bit_for_bit():
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn):
        t = torch.randn(3, 5).to(dtype)
        back = d.decode(d.encode(t))
        assert back.dtype == dtype and back.shape == t.shape
        assert back.view(torch.uint8).tolist() == t.view(torch.uint8).tolist()


def test_inputs_that_differ_make_the_builds_not_comparable_naming_the_case():
    ref = torch.randn(2, 4)
    with pytest.raises(d.NotComparable, match="drew different inputs for legacy"):
        d.outcome(0, 0, _case(0), "legacy", *_payloads(ref, ref, ref, inputs=("aaa", "bbb")))


def test_the_nondeterministic_path_is_the_legacy_entrypoints_grouped_int4_weights_and_only_that():
    int4 = _case(0, dtype="bfloat16", quant=Quant("int4_w4a16", 64))
    assert d.nondeterministic(int4, "legacy") == "atomic"
    assert d.nondeterministic(int4, "modular") is None  # TritonWNA16Experts: always the Triton kernel
    assert d.nondeterministic(replace(int4, quant=Quant("int8_w8a16", 64)), "legacy") is None
    assert d.nondeterministic(replace(int4, quant=Quant("int8_w8a16", 0)), "legacy") is None
    assert d.nondeterministic(_case(0), "legacy") is None
    assert "atomicAdd" in d.NONDETERMINISTIC[0].reason


def test_identical_fails_at_the_first_deterministic_difference_with_a_reproducer_naming_both_builds():
    same = _outcomes(10, True)
    differs = _outcomes(3, False, seed=1)
    run = (
        same[:4]
        + [replace(o, index=4 + k) for k, o in enumerate(differs)]
        + [replace(o, index=7 + k) for k, o in enumerate(same[4:])]
    )
    v = d.judge(run, "identical", len(run))
    assert not v.ok and v.differing == 3 and v.finding is not None and v.finding.index == 4
    assert v.reason.startswith("3 of 13 cases on deterministic paths differ from the base bit for bit (first: case 4")
    lines = v.lines("/b/base/bin/python", "/b/pr/bin/python")
    command = shlex.split(lines[-1].removeprefix("  reproduce: "))
    assert command[:4] == ["/b/pr/bin/python", "-m", "moegate", "diff"]
    assert "--base-python=/b/base/bin/python" in command and "--pr-python=/b/pr/bin/python" in command
    assert f"--case={v.finding.case.to_json()}" in command and "--entrypoint=legacy" in command
    assert d.judge(same, "identical", 10).ok


def test_identical_judges_the_atomic_path_as_equivalent_is_judged():
    int4 = _case(0, quant=Quant("int4_w4a16", 64))
    noise = _outcomes(12, False, case=int4)  # outputs differ, errors alike: the atomics' reordering
    assert all(o.path == "atomic" and not o.identical for o in noise)
    v = d.judge(noise, "identical", 12)
    assert v.ok, v.reason
    assert "12 on nondeterministic ones" in v.reason
    worse = [replace(o, pr_error=o.base_error * 1.2) for o in noise]
    v = d.judge(worse, "identical", 12)
    assert not v.ok and "int4_w4a16/bfloat16 sorted (atomic)" in v.reason


def test_equivalent_fails_a_pr_whose_error_grew_on_most_cases_of_a_group_and_passes_the_same_error():
    assert d.judge(_outcomes(12, True), "equivalent", 12).ok
    grown = [replace(o, pr_error=o.base_error * 1.05) for o in _outcomes(12, True)]
    v = d.judge(grown, "equivalent", 12)
    assert not v.ok and v.rejected == {"bfloat16 sorted"}
    assert "12 of 12 cases worse" in "\n".join(v.lines("b", "p"))


def test_a_pr_output_that_is_not_finite_or_of_another_shape_fails_at_once():
    ref = torch.randn(8, 128)
    base = ref.to(torch.bfloat16)
    nan = base.clone()
    nan[3, 5] = math.nan
    bad = d.outcome(0, 2, _case(2), "modular", *_payloads(ref, base, nan))
    assert bad.problem == "the PR's output is not finite where the base's is"
    v = d.judge(_outcomes(2, True) + [bad], "equivalent", 3)
    assert not v.ok and v.reason == "case 2: the PR's output is not finite where the base's is" and v.finding is bad
    short = d.outcome(0, 0, _case(0), "legacy", *_payloads(ref, base, base[:4]))
    assert "the PR's output is torch.bfloat16 [4, 128], the base's torch.bfloat16 [8, 128]" == short.problem


def test_a_run_that_paired_fewer_than_half_of_its_cases_is_not_a_pass():
    v = d.judge(_outcomes(4, True), "equivalent", 10)
    assert not v.ok and v.reason.startswith("not judged: only 4 of the 10 cases drawn ran in both builds")
    assert d.judge(_outcomes(5, True), "equivalent", 10).ok


def test_the_input_digest_changes_with_any_input_and_reads_each_banked_weight_once():
    bank = WeightBank(torch.device("cpu"), lambda w: w)
    case = _case(0, num_tokens=3)
    t, _, _ = bank.inputs(case)
    prints = d.Fingerprints()
    first = prints.digest(t)
    assert prints.digest(t) == first and len(prints._seen) == 2  # w1 and w2, read once
    other_routing, _, _ = bank.inputs(replace(case, routing=Routing(seed=1)))
    assert prints.digest(other_routing) != first
    changed = replace(t, w1=t.w1.clone())
    changed.w1.view(-1)[0] += 1  # the first element is in the strided sample
    assert d.Fingerprints().digest(changed) != first


def test_a_workers_payload_carries_the_reference_only_from_the_base():
    bank = WeightBank(torch.device("cpu"), lambda w: w)
    case = _case(0)
    t, _, _ = bank.inputs(case)
    out = torch.zeros(8, 128, dtype=torch.bfloat16)
    result = KernelResult(case, "legacy", "sorted", out, Closeness(0, 0, 0, True), None, t)
    base, pr = d.payload(result, d.Fingerprints(), True), d.payload(result, d.Fingerprints(), False)
    assert base["inputs"] == pr["inputs"] and base["key"] == ("legacy", case.to_json())
    assert "reference" in base and "magnitude" in base and "reference" not in pr
    assert d.decode(base["reference"]).dtype == torch.float32
