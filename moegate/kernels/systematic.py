"""The kernel tier's aggregate check: a small relative error common to every output of a run.

The elementwise rule of ``moegate.kernels.tolerance`` bounds the worst element, so a
kernel that makes every output 0.2 % too large passes it (bfloat16 allows about
3 % of ``A + rms A`` per element). Rounding errors of a correct kernel are close
to unbiased, so such an error shows in a statistic over all elements of a case,
pooled over the cases of a run. ``docs/design/kernels-systematic.md`` derives what
follows and states its false-alarm rate; in short:

- per case: ``b`` = the least-squares slope of ``out - ref`` on ``ref`` over all
  elements (``out = (1 + eps) ref`` gives ``b = eps``), and ``s``, its standard
  error under the rounding model (each rounding of the kernel an independent
  relative error of variance ``u**2 / 3``, propagated to ``b`` through the
  layer: the first product's and the activation's roundings through the second
  product, so an output row's shared roundings count once, as they are shared);
- per group (entrypoint, placement, dtype family): the precision-weighted mean
  ``beta`` of the cases' ``b`` with weights ``1 / s**2``; the cases are the
  independent units, their spread about the model a factor ``kappa`` estimated
  from the run itself, pooled per family (placement set aside, each distinct
  call once: placement never changes a kernel's output, which the tier asserts);
- verdict: a group is *detected* when its two-sided Student-t interval at level
  ``1 - ALPHA / G`` (Bonferroni over the ``G`` groups tested) lies outside
  ``[-m, m]``, ``m = MARGIN_UNITS * u`` of the family's compute dtype (u/8: 0.049 %
  for bfloat16, 0.0061 % for float16 and float32): a correct kernel on the H200
  carries biases of up to u/15 that the model does not describe (the docs page).

float32 cases are compared with a reference whose products' operands are
truncated to TF32 as the tensor cores read them (``tf32``): Triton's ``tl.dot``
hands float32 operands to the MMA unit, which ignores their 13 low mantissa
bits, a bias of about -0.1 % that a plain float32 reference would report.
fp8_w8a8 is not checked here (its products accumulate in the tensor cores'
reduced fp8 accumulator, a rounding this model does not describe).

No vLLM import: the unit tier runs this on a CPU with torch alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from moegate.core.activation import Activation
from moegate.core.case import MoECase
from moegate.core.tensors import VECTOR_ROUTING_TOKENS, CaseTensors, torch_dtype
from moegate.kernels.reference import check_ids, dequantize
from moegate.kernels.student_t import t_critical
from moegate.kernels.tolerance import UNIT_ROUNDOFF

ALPHA = 1e-3
"""Family-wise false-alarm rate of one run (a pytest session or one sweep), split over its groups (Bonferroni)."""

MARGIN_UNITS = 1 / 8
"""The margin in units of the family's unit roundoff: the relative bias a correct kernel may carry unexplained.

Calibrated, not derived: on the H200 (vLLM 0.33.0, 5,000 cases) correct bfloat16 calls carry -u/27 and
wNa16 bfloat16 ones up to -u/15, causes not established (docs/design/kernels-systematic.md); u/8 is twice that."""


def margin_of(fam: str) -> float:
    """The family's margin: ``MARGIN_UNITS`` times the unit roundoff of its compute dtype."""
    dtype = fam.removeprefix("wNa16-")
    return MARGIN_UNITS * UNIT_ROUNDOFF[torch_dtype(dtype)]


TF32_DROPPED_BITS = 13
"""float32 mantissa bits the tensor cores ignore in a TF32 operand (23 stored, 10 kept)."""


def family(case: MoECase) -> str | None:
    """The dtype family a case pools with, or None where the check does not apply.

    It does not apply to fp8_w8a8, nor to an activation other than plain silu or to expert biases: the
    variance model below is silu's, without biases; such calls are judged call by call (``compare``).
    Nor to the index-width calls (hundreds of thousands of tokens): the aggregate pools decode-sized
    calls, and one such call's moments would hold gigabytes.
    """
    if case.activation != Activation() or case.bias or case.num_tokens > VECTOR_ROUTING_TOKENS:
        return None
    if case.quant is None:
        return case.dtype
    if case.quant.weight_only:
        return f"wNa16-{case.dtype}"
    return None


def tf32(x: torch.Tensor) -> torch.Tensor:
    """float32 values as the tensor cores read a TF32 operand: the 13 low mantissa bits dropped (toward zero)."""
    bits = x.float().contiguous().view(torch.int32)
    return (bits & ~((1 << TF32_DROPPED_BITS) - 1)).view(torch.float32)


@dataclass(frozen=True)
class Sample:
    """One kernel call's contribution: its group, its identity, its estimate and the estimate's model error."""

    entrypoint: str
    placement: str
    family: str
    call: str  # the case without its placement, with the entrypoint: equal calls give equal outputs
    case: str  # the case's JSON (the reproducer)
    estimate: float  # b: slope of out - ref on ref
    scale: float  # s: standard error of b under the rounding model

    @property
    def group(self) -> tuple[str, str, str]:
        return (self.entrypoint, self.placement, self.family)


@dataclass
class Moments:
    """What a call's estimate needs from its reference: the reference, its sum of squares, ``s``."""

    ref: torch.Tensor  # [M, K] float32
    sum_squares: float
    scale: float  # s

    def estimate(self, output: torch.Tensor) -> float:
        """b: the least-squares slope of ``output - ref`` on ``ref``."""
        return float(((output.float() - self.ref) * self.ref).sum()) / self.sum_squares


def case_moments(t: CaseTensors, case: MoECase) -> Moments | None:
    """The call's reference and ``s`` (the module docstring), or None when its reference is all zero or not finite.

    Computed in float32 on the inputs' device, from the same rounded inputs the
    kernel got; for float32 the products' operands are truncated to TF32 first.
    """
    dtype = torch_dtype(case.dtype)
    u = UNIT_ROUNDOFF[dtype]
    truncate = case.quant is None and dtype == torch.float32
    op = tf32 if truncate else (lambda v: v.float())
    x = op(t.hidden_states)
    m, k = x.shape
    ids = check_ids(t.topk_ids, t.w1.shape[0], t.expert_map)
    weights = t.topk_weights.float()
    on_input = case.apply_router_weight_on_input
    experts = torch.unique(ids[ids >= 0]).tolist()
    ref = torch.zeros((m, k), dtype=torch.float32, device=x.device)
    kept: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    kept = []
    for e in experts:
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if case.quant is None:
            w1e, w2e = t.w1[e].float(), t.w2[e].float()
        else:
            assert t.w1_scale is not None and t.w2_scale is not None  # quantized inputs carry their scales
            w1e = dequantize(t.w1[e : e + 1], t.w1_scale[e : e + 1], case.quant)[0]
            w2e = dequantize(t.w2[e : e + 1], t.w2_scale[e : e + 1], case.quant)[0]
        w1e, w2e = op(w1e), op(w2e)
        n = w1e.shape[0] // 2
        route = weights[tok, slot].unsqueeze(1)
        h = x[tok] @ w1e.T
        if on_input:
            h = h * route  # the kernel scales the first product's accumulator
        hg, hu = h[:, :n], h[:, n:]
        act = F.silu(hg) * hu
        y = op(act) @ w2e.T
        if not on_input:
            y = y * route
        ref.index_add_(0, tok, y)
        kept.append((tok, route, hg, hu, act, w2e, y))
    ss = float((ref * ref).sum())
    if not math.isfinite(ss) or ss == 0.0:
        return None
    # variance of sum(ref * err) under the model, in units of u**2 / 3 (docs/design/kernels-systematic.md)
    v = (ref**4).sum()  # the output's rounding
    for tok, route, hg, hu, act, w2e, y in kept:
        g = ref[tok] @ w2e  # sensitivity of sum(ref * out) to this pair's activation
        if not on_input:
            g = g * route
        sig = torch.sigmoid(hg)
        dsilu = sig * (1 + hg * (1 - sig))
        # the first product's roundings (gate and up) and the activation's, through the second product;
        # then the rounding of the pair's weighted output
        v = v + (g * g * (2 * act * act + (dsilu * hg * hu) ** 2)).sum() + (ref[tok] ** 2 * y * y).sum()
    s = u * math.sqrt(float(v) / 3) / ss
    return Moments(ref, ss, s) if math.isfinite(s) else None


def sample_of(case: MoECase, entrypoint: str, t: CaseTensors, output: torch.Tensor) -> Sample | None:
    """The call's ``Sample``, or None where the check does not apply (fp8, an all-zero reference, non-finite)."""
    fam = family(case)
    if fam is None:
        return None
    moments = case_moments(t, case)
    if moments is None:
        return None
    return sample_from(case, entrypoint, fam, moments.estimate(output), moments.scale)


def sample_from(case: MoECase, entrypoint: str, fam: str, estimate: float, scale: float) -> Sample | None:
    """The ``Sample`` of a call whose estimate is known (None when it is not finite)."""
    if not math.isfinite(estimate):
        return None
    d = case.to_dict()
    d.pop("placement")
    call = entrypoint + " " + repr(sorted(d.items()))
    return Sample(entrypoint, case.placement.label, fam, call, case.to_json(), estimate, scale)


# --- pooling ------------------------------------------------------------------------------------------------


@dataclass
class GroupResult:
    entrypoint: str
    placement: str
    family: str
    cases: int
    estimate: float  # beta
    stderr: float  # kappa * (sum of weights) ** -1/2
    low: float  # the interval at the Bonferroni level
    high: float
    margin: float
    detected: bool
    worst: Sample  # the case furthest in the estimate's direction, in units of its own error

    def line(self) -> str:
        verdict = "DETECTED" if self.detected else "ok"
        return (
            f"{self.entrypoint} {self.placement} {self.family}: {self.cases} cases, relative bias "
            f"{self.estimate:+.4%} (interval [{self.low:+.4%}, {self.high:+.4%}]) {verdict}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "entrypoint": self.entrypoint,
            "placement": self.placement,
            "family": self.family,
            "cases": self.cases,
            "estimate": self.estimate,
            "stderr": self.stderr,
            "interval": [self.low, self.high],
            "margin": self.margin,
            "detected": self.detected,
            "worst_case": {"case": self.worst.case, "estimate": self.worst.estimate, "stderr": self.worst.scale},
        }


@dataclass
class FamilySpread:
    kappa: float  # the cases' spread about the model, pooled
    df: int
    calls: int  # distinct calls (placement set aside)


@dataclass
class Summary:
    alpha: float
    margins: dict[str, float]  # per family
    groups: list[GroupResult]
    families: dict[str, FamilySpread]
    untested: dict[str, int] = field(default_factory=dict)  # family -> samples, where df < 1
    samples: int = 0

    @property
    def level(self) -> float:
        """Two-sided level of each group's interval: 1 - alpha / G."""
        return 1 - self.alpha / max(1, len(self.groups))

    @property
    def detected(self) -> list[GroupResult]:
        return [g for g in self.groups if g.detected]

    def lines(self) -> list[str]:
        head = (
            f"systematic error: {len(self.groups)} groups of {self.samples} cases, intervals at "
            f"{self.level:.6%} (family-wise {self.alpha:g}), a group detected outside +-its family's margin"
        )
        out = [head]
        for name, f in sorted(self.families.items()):
            out.append(
                f"  {name}: spread {f.kappa:.3g} of the rounding model, {f.calls} distinct calls, df {f.df}, "
                f"margin +-{self.margins[name]:.4%}"
            )
        for name, n in sorted(self.untested.items()):
            out.append(f"  {name}: {n} cases, too few distinct calls to estimate their spread: not tested")
        out += ["  " + g.line() for g in self.groups]
        return out

    def failure_message(self) -> str:
        """What a reviewer needs: each detected group, its estimate and interval, its cases, its worst case."""
        head = (
            f"a systematic relative error common to the cases of {len(self.detected)} group(s) "
            f"(interval at {self.level:.6%} outside +-the family's margin; moegate.kernels.systematic, "
            "docs/design/kernels-systematic.md):"
        )
        parts = [head]
        for g in self.detected:
            parts.append(
                f"- {g.line()}, margin +-{g.margin:.4%}\n  worst case ({g.worst.entrypoint}, its own bias {g.worst.estimate:+.4%} "
                f"+- {g.worst.scale:.2g}): reproduce: MoECase.from_json('{g.worst.case}')"
            )
        return "\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "alpha": self.alpha,
            "margins": self.margins,
            "level": self.level,
            "samples": self.samples,
            "detected": len(self.detected),
            "families": {k: vars(v) for k, v in sorted(self.families.items())},
            "untested": self.untested,
            "groups": [g.to_json() for g in self.groups],
        }


def _weighted(samples: Sequence[Sample]) -> tuple[float, float]:
    """(weighted mean of the estimates, sum of weights), weights 1 / s**2 (a zero s counts as the tiniest)."""
    w = [1.0 / max(x.scale, 1e-300) ** 2 for x in samples]
    total = sum(w)
    return sum(wi * x.estimate for wi, x in zip(w, samples, strict=True)) / total, total


def summarise(samples: Iterable[Sample], alpha: float = ALPHA, margin: float | None = None) -> Summary:
    """Each group's estimate, interval and verdict from a run's samples (the module docstring's rule).

    ``margin``: one margin for every family instead of ``margin_of`` (the unit tier's calibration checks).
    """
    if not 0 < alpha < 1 or (margin is not None and margin < 0):
        raise ValueError(f"alpha must be in (0, 1) and margin non-negative; got {alpha}, {margin}")
    samples = list(samples)
    groups: dict[tuple[str, str, str], dict[str, Sample]] = {}
    calls: dict[tuple[str, str], dict[str, Sample]] = {}
    for x in samples:
        groups.setdefault(x.group, {}).setdefault(x.case + x.entrypoint, x)  # the same call twice counts once
        calls.setdefault((x.entrypoint, x.family), {}).setdefault(x.call, x)
    # the spread: residuals about each (entrypoint, family) mean, each distinct call once, pooled per family
    rss: dict[str, float] = {}
    dfs: dict[str, int] = {}
    ncalls: dict[str, int] = {}
    for (_, fam), members in calls.items():
        xs = list(members.values())
        mean, _ = _weighted(xs)
        rss[fam] = rss.get(fam, 0.0) + sum((x.estimate - mean) ** 2 / max(x.scale, 1e-300) ** 2 for x in xs)
        dfs[fam] = dfs.get(fam, 0) + len(xs) - 1
        ncalls[fam] = ncalls.get(fam, 0) + len(xs)
    spreads = {f: FamilySpread(math.sqrt(rss[f] / dfs[f]), dfs[f], ncalls[f]) for f in dfs if dfs[f] >= 1}
    untested = {f: sum(len(m) for (_, g), m in calls.items() if g == f) for f in dfs if dfs[f] < 1}
    tested = sorted(k for k in groups if k[2] in spreads)
    crit: dict[str, float] = {}
    out = []
    for key in tested:
        xs = list(groups[key].values())
        spread = spreads[key[2]]
        if key[2] not in crit:
            crit[key[2]] = t_critical(alpha / len(tested), spread.df)
        beta, total = _weighted(xs)
        se = spread.kappa / math.sqrt(total)
        half = crit[key[2]] * se
        low, high = beta - half, beta + half
        sign = 1.0 if beta >= 0 else -1.0
        worst = max(xs, key=lambda x: sign * x.estimate / max(x.scale, 1e-300))
        m = margin_of(key[2]) if margin is None else margin
        out.append(GroupResult(*key, len(xs), beta, se, low, high, m, low > m or high < -m, worst))
    margins = {f: margin_of(f) if margin is None else margin for f in spreads}
    return Summary(alpha, margins, out, spreads, untested, len(samples))


class Collector:
    """Samples gathered over a session (the kernel tier's conftest registers ``add`` with ``moegate.kernels.check``)."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.calls = 0

    def add(self, result: Any) -> None:
        """Keep a ``KernelResult``'s sample, if it has one."""
        self.calls += 1
        s = getattr(result, "systematic", None)
        if s is not None:
            self.samples.append(s)

    def summary(self, alpha: float = ALPHA, margin: float | None = None) -> Summary:
        return summarise(self.samples, alpha, margin)
