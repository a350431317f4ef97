"""The differential kernel tier's verdict: base against PR on the same cases, judged by the promise the PR makes.

Both builds ran each case on the same inputs (checked bit for bit: a digest of every input), and the base's
worker computed the fp32 torch reference once (``moegate.kernels.reference``); each build's error against it is
the RMS over the output's elements of ``|out - ref| / tol``, ``tol`` the kernel tier's elementwise tolerance
(only its weighting of the elements matters here: both builds share it).

- ``identical``: every case on a path that computes deterministically gives the same output bit for bit; the
  first that does not is the finding, printed as a command that runs it through both builds. The paths that do
  not compute deterministically are named in ``NONDETERMINISTIC`` (one place) and judged as ``equivalent`` is.
- ``equivalent``: per group (dtype family and path), the PR's error is no larger than the base's: the paired
  sign test with a margin of ``moegate.kernels.paired``, Holm over the groups at ``paired.ALPHA``.

Under either promise a PR output that is not finite where the base's is, or of another shape, is a finding at
once, and a run that paired fewer than half the cases it drew (the budget ran out) is not a PASS.

The minimum error ratio worth reporting (``MIN_RATIO``)
-------------------------------------------------------
One more rounding to the output dtype of a value not on its grid adds an error uniform on half a unit in the
last place either way, variance ``ulp**2 / 12``, independent of what the kernel already erred. The kernel's own
error is a sum of such roundings, as many as the kernel tier's tolerance rule charges it: ``ROUNDINGS`` of
intermediates, the operands' ``r_in`` and the activation's extra ones (``moegate.kernels.reference``), at most
``BUDGET = 4 + 8 + 1 = 13`` for any family (wNa16 weights, a sensitive activation). So one extra rounding
raises the RMS error by a factor of at least ``ONE_ROUNDING = sqrt(1 + 1 / BUDGET) = 1.038`` where the error
budget is largest, and by up to ``sqrt(2)`` where the kernel rounds only its output. A harmless change leaves
the ratio at 1 (or below). ``MIN_RATIO`` is the geometric midpoint of the two, ``sqrt(ONE_ROUNDING) = 1.019``:
a case counts as worse only when its error grew by more than half (in the logarithm) of what the least
visible extra rounding does. On the CPU emulation of the kernel in ``tests/unit/kernels/
test_differential_power.py`` (bfloat16 and float16, 128-4,096 output elements a case) one extra rounding puts
about 90 % of cases past it (median ratio 1.05), a reversed top-k sum about 15 % (median 1.00), silu-and-mul
in float32 about 5 % (median 0.92).

No vLLM import: the unit tier runs this on a CPU.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from moegate.core.case import MoECase
from moegate.core.hashing import bytes_sha256
from moegate.core.tensors import CaseTensors, torch_dtype
from moegate.kernels import activations
from moegate.kernels.check import reference_for
from moegate.kernels.paired import ALPHA, SignTest, judge_groups
from moegate.kernels.reference import Reference
from moegate.kernels.tolerance import OPERAND_ROUNDINGS, ROUNDINGS, tolerance

PROMISES = ("identical", "equivalent")

BUDGET = ROUNDINGS + max(OPERAND_ROUNDINGS.values()) + max(activations.SENSITIVITY.values())
"""The most roundings the tolerance rule charges any family (the module docstring)."""
ONE_ROUNDING = math.sqrt(1 + 1 / BUDGET)
"""The RMS error's growth from one extra rounding where the error budget is largest."""
MIN_RATIO = math.sqrt(ONE_ROUNDING)
"""The minimum error ratio worth reporting: a case is worse only past it (the module docstring)."""


class NotComparable(ValueError):
    """The two builds cannot be compared on these cases (one line): the tier is not judged."""


# --- the paths that do not compute deterministically ------------------------------------------


@dataclass(frozen=True)
class Nondeterministic:
    """A path whose output depends on the order in which the GPU's threads finish, with the reason."""

    name: str
    reason: str
    applies: Callable[[MoECase, str], bool]


def _cuda_wna16(case: MoECase, entrypoint: str) -> bool:
    q = case.quant
    return entrypoint == "legacy" and q is not None and q.scheme == "int4_w4a16" and q.group_size > 0


NONDETERMINISTIC: tuple[Nondeterministic, ...] = (
    Nondeterministic(
        "atomic",
        "vLLM's CUDA wNa16 GEMM (moe_wna16_gemm, csrc/moe/moe_wna16.cu) splits K over thread blocks and adds each "
        "block's partial sum into the 16-bit output with atomicAdd, in whatever order the blocks finish. The legacy "
        "entrypoint sends grouped int4_w4a16 there (0.33.0's should_moe_wna16_use_cuda: group size 32, 64 or 128 "
        "and tokens * top_k / experts <= 6); every legacy grouped int4 case is named, so a PR that moves that "
        "threshold is not read as a difference. The Triton kernels run with SPLIT_K = 1 and no atomics, and "
        "moe_sum adds the top-k in a fixed order: every other path is deterministic.",
        _cuda_wna16,
    ),
)
"""Every nondeterministic path the tier knows, in one place: judged as ``equivalent`` under either promise.

Not on the list: ``moe_align_block_size`` places each expert's tokens in its blocks with ``atomicAdd``, so a row's
place in a block varies, but a row's products do not depend on its place (the kernel tier's naive == sorted
property, bit for bit, rests on the same fact)."""


def nondeterministic(case: MoECase, entrypoint: str) -> str | None:
    """The name of the nondeterministic path ``case`` may take at ``entrypoint``, or None."""
    return next((n.name for n in NONDETERMINISTIC if n.applies(case, entrypoint)), None)


def family(case: MoECase) -> str:
    """The dtype family a case is grouped by: its dtype, with the weights' scheme where they are quantized."""
    return case.dtype if case.quant is None else f"{case.quant.scheme}/{case.dtype}"


# --- one case --------------------------------------------------------------------------------


def encode(t: torch.Tensor) -> dict[str, Any]:
    """A tensor as plain data (dtype, shape, bytes) for the workers' queue: no shared memory between builds."""
    flat = t.detach().contiguous().cpu().reshape(-1)
    return {
        "dtype": str(flat.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "data": flat.view(torch.uint8).numpy().tobytes(),
    }


def decode(d: dict[str, Any]) -> torch.Tensor:
    dtype = getattr(torch, d["dtype"])
    raw = torch.frombuffer(bytearray(d["data"]), dtype=torch.uint8) if d["data"] else torch.empty(0, dtype=torch.uint8)
    return raw.view(dtype).reshape(d["shape"])


def scaled_error(output: torch.Tensor, ref: Reference, case: MoECase) -> float:
    """RMS over the output's elements of ``|out - ref| / tol`` (elements with a zero tolerance left out)."""
    tol = tolerance(ref, torch_dtype(case.dtype), case.quant, case.activation)
    keep = tol > 0
    if not bool(keep.any()):
        return 0.0
    err = (output.float() - ref.output)[keep] / tol[keep]
    return float(err.pow(2).mean().sqrt())


@dataclass(frozen=True)
class Outcome:
    """One case in both builds: the same output or not, and each build's error against the one reference."""

    run: int
    index: int  # the case's place in its run's stream
    entrypoint: str
    case: MoECase
    group: str
    path: str | None  # the nondeterministic path's name, or None
    identical: bool
    max_abs_diff: float
    base_error: float
    pr_error: float
    problem: str | None = None  # the PR's output is not finite where the base's is, or has another shape or dtype

    @property
    def label(self) -> str:
        return f"{self.entrypoint} {self.case.short()} dtype={self.case.dtype}"


def outcome(run: int, index: int, case: MoECase, entrypoint: str, base: dict[str, Any], pr: dict[str, Any]) -> Outcome:
    """Compare one case's two payloads (``moegate.kernels.runner.DiffRunner``); ``NotComparable`` on other inputs."""
    if base["inputs"] != pr["inputs"]:
        raise NotComparable(
            f"the builds drew different inputs for {entrypoint} {case.to_json()} (digests {base['inputs'][:12]} and "
            f"{pr['inputs'][:12]}): their torch draws other numbers from the same seeds"
        )
    b, p = decode(base["output"]), decode(pr["output"])
    ref = Reference(decode(base["reference"]), decode(base["magnitude"]))
    path = nondeterministic(case, entrypoint)
    group = f"{family(case)} {pr['path']}" + (f" ({path})" if path else "")
    problem = None
    if p.shape != b.shape or p.dtype != b.dtype:
        problem = f"the PR's output is {p.dtype} {list(p.shape)}, the base's {b.dtype} {list(b.shape)}"
    elif not bool(torch.isfinite(p.float()).all()) and bool(torch.isfinite(b.float()).all()):
        problem = "the PR's output is not finite where the base's is"
    if problem is not None:
        return Outcome(
            run, index, entrypoint, case, group, path, False, math.inf, scaled_error(b, ref, case), math.nan, problem
        )
    same = base["output"]["data"] == pr["output"]["data"]
    diff = 0.0 if same else float((p.float() - b.float()).abs().nan_to_num(math.inf).max())
    return Outcome(
        run, index, entrypoint, case, group, path, same, diff, scaled_error(b, ref, case), scaled_error(p, ref, case)
    )


# --- a worker's side: what it sends back for one case ------------------------------------------

SAMPLED = 1 << 20
"""Elements a weight's fingerprint reads at most: another generator changes every value, so a strided sample of
them tells two weight sets apart (a check that the builds drew the same numbers, not a defence against forgery)."""


def _bytes(t: torch.Tensor, sample: bool = False) -> bytes:
    flat = t.detach().contiguous().reshape(-1)
    if sample and flat.numel() > SAMPLED:
        flat = flat[:: -(-flat.numel() // SAMPLED)]
    head = f"{flat.dtype}:{list(t.shape)}:".encode()
    return head + flat.cpu().contiguous().view(torch.uint8).numpy().tobytes()


class Fingerprints:
    """The digest of a case's inputs; the weight bank's tensors (weights, scales, biases) read once each."""

    def __init__(self) -> None:
        self._seen: dict[tuple[int, int, tuple[int, ...], str], bytes] = {}

    def _cached(self, t: torch.Tensor) -> bytes:
        key = (t.untyped_storage().data_ptr(), int(t.storage_offset()), tuple(t.shape), str(t.dtype))
        if key not in self._seen:
            self._seen[key] = bytes_sha256([_bytes(t, sample=True)]).encode()
        return self._seen[key]

    def digest(self, t: CaseTensors) -> str:
        per_case = (t.hidden_states, t.topk_weights, t.topk_ids, t.expert_map)
        banked = (t.w1, t.w2, t.w1_scale, t.w2_scale, t.w1_bias, t.w2_bias)
        parts = [b"-" if x is None else _bytes(x) for x in per_case]
        parts += [b"-" if x is None else self._cached(x) for x in banked]
        return bytes_sha256(parts)


def payload(result: Any, fingerprints: Fingerprints, reference: bool) -> dict[str, Any]:
    """What one build's worker sends back for a case it ran (a ``KernelResult`` with its tensors): the output, the
    path, the inputs' digest, this build's own kernel-tier check, and with ``reference`` the fp32 torch reference."""
    t = result.tensors
    assert t is not None, "run_checked keeps the inputs a case ran on"
    out: dict[str, Any] = {
        "key": (result.entrypoint, result.case.to_json()),
        "path": result.path,
        "ok": bool(result.closeness.ok),
        "inputs": fingerprints.digest(t),
        "output": encode(result.output),
    }
    if reference:
        ref = reference_for(result.case, t)
        out["reference"], out["magnitude"] = encode(ref.output), encode(ref.magnitude)
    return out


# --- the verdict ------------------------------------------------------------------------------


def reproducer(o: Outcome, base_python: str, pr_python: str, promise: str) -> str:
    """A command that runs ``o``'s case through both builds again (``moegate diff --case``)."""
    return shlex.join(
        [
            pr_python, "-m", "moegate", "diff", f"--base-python={base_python}", f"--pr-python={pr_python}",
            f"--promise={promise}", f"--entrypoint={o.entrypoint}", f"--case={o.case.to_json()}",
        ]
    )  # fmt: skip


@dataclass
class Verdict:
    """One run judged under one promise: PASS or FAIL with its one-line reason, and what it rests on."""

    promise: str
    ok: bool
    reason: str
    paired: int
    drawn: int
    tests: list[SignTest] = field(default_factory=list)
    rejected: set[str] = field(default_factory=set)
    finding: Outcome | None = None  # the case a reproducer is printed for
    differing: int = 0  # deterministic cases whose outputs differ

    def lines(self, base_python: str, pr_python: str) -> list[str]:
        out = [f"{'PASS' if self.ok else 'FAIL'} ({self.promise}): {self.reason}"]
        out += [("  FAIL " if t.group in self.rejected else "  ") + t.describe() for t in self.tests]
        if self.finding is not None:
            o = self.finding
            out.append(f"  first: case {o.index}: {o.label}: {o.problem or f'max |pr - base| = {o.max_abs_diff:.3g}'}")
            out.append("  reproduce: " + reproducer(o, base_python, pr_python, self.promise))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "promise": self.promise,
            "verdict": "PASS" if self.ok else "FAIL",
            "reason": self.reason,
            "paired": self.paired,
            "drawn": self.drawn,
            "differing": self.differing,
            "groups": [{**t.__dict__, "rejected": t.group in self.rejected} for t in self.tests],
            "finding": None
            if self.finding is None
            else {"entrypoint": self.finding.entrypoint, "case": self.finding.case.to_dict()},
        }


def judge(
    outcomes: Sequence[Outcome], promise: str, drawn: int, *, ratio: float = MIN_RATIO, alpha: float = ALPHA
) -> Verdict:
    """The verdict of one run, clause by clause (the module docstring); the first clause that fails is the reason."""
    if promise not in PROMISES:
        raise ValueError(f"unknown promise {promise!r}; expected one of {PROMISES}")
    ordered = sorted(outcomes, key=lambda o: o.index)
    paired = len(ordered)
    tested = ordered if promise == "equivalent" else [o for o in ordered if o.path is not None]
    groups: dict[str, list[tuple[float, float]]] = {}
    for o in tested:
        if o.problem is None:
            groups.setdefault(o.group, []).append((o.base_error, o.pr_error))
    tests, rejected = judge_groups(groups, ratio, alpha)
    differing = [o for o in ordered if o.path is None and not o.identical and o.problem is None]
    v = Verdict(promise, True, "", paired, drawn, tests, rejected, None, len(differing))
    broken = next((o for o in ordered if o.problem is not None), None)
    if 2 * paired < drawn:
        v.ok, v.reason = (
            False,
            f"not judged: only {paired} of the {drawn} cases drawn ran in both builds (the budget ran out)",
        )
    elif broken is not None:
        v.ok, v.reason, v.finding = False, f"case {broken.index}: {broken.problem}", broken
    elif promise == "identical" and differing:
        first = differing[0]
        v.ok, v.finding = False, first
        v.reason = (
            f"{len(differing)} of {paired} cases on deterministic paths differ from the base bit for bit "
            f"(first: case {first.index}, max |pr - base| = {first.max_abs_diff:.3g})"
        )
    elif rejected:
        worst = ", ".join(sorted(rejected))
        v.ok = False
        v.reason = (
            f"the PR's error exceeds the base's by more than {ratio:.3f}x in {worst} (Holm, family-wise {alpha:g})"
        )
    else:
        judged = sum(t.testable for t in tests)
        tested_line = f"{judged} group(s) tested, none worse than the base beyond {ratio:.3f}x"
        if promise == "equivalent":
            v.reason = f"{paired} cases paired; {tested_line}"
        else:
            same = paired - len(tested)
            v.reason = f"{paired} cases paired: {same} on deterministic paths, each equal to the base bit for bit"
            v.reason += f"; {len(tested)} on nondeterministic ones: {tested_line}" if tested else ""
    return v
