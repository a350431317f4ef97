"""The differential tier's false-FAIL rate and power on a CPU emulation of the kernel: a same-build pair, harmless
re-implementations and one extra rounding in the epilogue, each judged over many simulated PRs.

The "kernel" is ``tests.support.diff_standin``'s: vLLM's fused MoE computed with the roundings the GPU kernel
makes. The PR builds are the same function with the real planted changes applied (``plant_experts.py``, the
code the GPU run plants into vLLM): ``topk-order=reverse`` and ``act-fp32=silu`` (harmless), ``moe-reround=3``
(one more rounding of every output element). Each variant runs a pool of cases once; a simulated PR is then 300
cases drawn from its pool with a fixed seed (the gate's ``--diff-cases``) and judged as the tier judges a run.
The GPU's own figures come from ``lab/gpu/diff.sh``; these say the rule does what it is derived to do.
"""

from __future__ import annotations

import random
import types
from functools import cache
from typing import Any

import pytest
import torch

from moegate.builds.planted import parse_bug
from moegate.core.case import MoECase, Routing
from moegate.core.spec import expected_path
from moegate.kernels.check import reference_for
from moegate.kernels.differential import MIN_RATIO, Outcome, encode, judge, outcome
from moegate.kernels.inputs import WeightBank
from tests.support.diff_standin import FUSED_MOE, FUSED_MOE_SITE
from tests.support.plants import experts_plants

POOL = 120
PRS = 400
CASES = 300


def _kernel(bug: str | None) -> Any:
    """The stand-in ``fused_experts``, with ``bug`` planted into it as a build plants it into vLLM."""
    module = types.ModuleType(FUSED_MOE)
    exec(FUSED_MOE_SITE, module.__dict__)  # noqa: S102 - the stand-in's own source, as a build's site holds it
    if bug is not None:
        config = parse_bug(bug)
        experts_plants().patches(config)[config["kind"]][FUSED_MOE](module)
    return module.fused_experts


def _cases() -> list[MoECase]:
    rng = random.Random(3)
    out = []
    for i in range(POOL):
        top_k = rng.choice((1, 2, 3, 4, 6, 8))
        out.append(
            MoECase(
                num_tokens=rng.randint(1, 16), top_k=top_k, num_experts=16, hidden=rng.choice((128, 256)),
                intermediate=128, dtype=rng.choice(("bfloat16", "float16")), routing=Routing(seed=i),
            )
        )  # fmt: skip
    return out


def _payload(out: torch.Tensor, t: Any, case: MoECase, reference: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"inputs": "same", "output": encode(out), "path": expected_path(case, "legacy").path.value}
    if reference:
        ref = reference_for(case, t)
        d["reference"], d["magnitude"] = encode(ref.output), encode(ref.magnitude)
    return d


@cache
def _pool(bug: str | None) -> tuple[Outcome, ...]:
    """Each case of the pool through the base kernel and the PR's, compared as the tier compares them."""
    torch.manual_seed(0)
    bank = WeightBank(torch.device("cpu"), lambda w: w)
    base, pr = _kernel(None), _kernel(bug)
    found = []
    for i, case in enumerate(_cases()):
        t, _, _ = bank.inputs(case)
        args = (t.hidden_states, t.w1, t.w2, t.topk_weights, t.topk_ids)
        b, p = _payload(base(*args), t, case, True), _payload(pr(*args), t, case, False)
        found.append(outcome(0, i, case, "legacy", b, p))
    return tuple(found)


def _fail_rate(bug: str | None, promise: str) -> float:
    """The share of ``PRS`` simulated PRs (``CASES`` cases drawn from the pool, fixed seeds) that FAIL."""
    pool = _pool(bug)
    rng = random.Random(11)
    fails = 0
    for _ in range(PRS):
        drawn = [pool[rng.randrange(len(pool))] for _ in range(CASES)]
        run = [Outcome(**{**o.__dict__, "index": j}) for j, o in enumerate(drawn)]
        fails += not judge(run, promise, CASES).ok
    return fails / PRS


def _worse_share(bug: str) -> float:
    pool = _pool(bug)
    return sum(o.pr_error > MIN_RATIO * o.base_error for o in pool) / len(pool)


def test_a_same_build_pair_never_fails_either_promise():
    assert all(o.identical for o in _pool(None))
    assert _fail_rate(None, "identical") == 0 and _fail_rate(None, "equivalent") == 0


@pytest.mark.parametrize("bug", ["topk-order=reverse", "act-fp32=silu"])
def test_a_harmless_re_implementation_fails_equivalent_in_at_most_one_pr_in_a_hundred(bug):
    """Another summation order, an elementwise op redone in float32: outputs differ (identical FAILs, as it must),
    yet no larger error than the base's."""
    assert not all(o.identical for o in _pool(bug))
    assert _fail_rate(bug, "identical") == 1.0
    assert _fail_rate(bug, "equivalent") <= 0.01
    assert _worse_share(bug) < 0.5


def test_one_extra_rounding_in_the_epilogue_fails_equivalent_in_nearly_every_pr():
    assert _worse_share("moe-reround=3") >= 0.7
    assert _fail_rate("moe-reround=3", "equivalent") >= 0.99


def test_a_power_of_two_re_rounding_is_exact_and_passes_identical():
    assert all(o.identical for o in _pool("moe-reround=2"))
