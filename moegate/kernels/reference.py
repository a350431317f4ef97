"""A torch reference for the fused-MoE layer, and the tolerance the kernel tier compares with.

Written from the layer's definition, not from vLLM's code: for each token and
each of its routed experts ``e`` with router weight ``w``,

    h   = x @ w1[e].T + b1[e]
    y_e = act(h) @ w2[e].T + b2[e]
    out = sum over routed experts of w * y_e

where ``act`` is the case's activation (``moegate.kernels.activations``: silu of the
gate half times the up half by default, clamp-limited SwiGLU forms, GELU, SiTU, and
the ungated forms whose w13 has N rows) and ``b1``, ``b2`` the experts' biases when the
case has them (zero otherwise). With ``apply_router_weight_on_input`` the weight
scales ``h`` instead (the kernel multiplies the first product's accumulator, bias
included, by it) and ``y_e`` is not scaled after. Everything is computed in float32
from the same rounded inputs the kernel gets. With an expert map, global ids map to
local ones and experts owned by another rank (``-1``) contribute zero.

Fused shared experts need nothing of their own: a shared expert is one more
row of w1 and w2 (after the routed rows) and one more id in every token's
top-k (after the routed ids) with its router weight, so the sum above already
adds it in full for every token. Under an expert map the map sends the shared
ids to this rank's rows after its routed ones (every rank holds them), so they
are never remote. What the reference does check is that every id reaches a
row (``check_ids``): a shared id beyond w1's rows or beyond the map is a
malformed call, not an expert to drop.

Conditions (``without``): each part of the definition a kernel could get wrong while the rest
stays right can be left out of the reference, so ``moegate.kernels.conditions`` can ask whether a
case made it matter: the activations' clamps and parameters (``activations.CONDITIONS``), each
expert bias (``W13_BIAS``, ``W2_BIAS``), the router weight on the input (``ON_INPUT``: without it the
weight scales ``y_e``), the expert map (``EXPERT_MAP``: without it global ids index local rows), the
wNa16 zero point (``ZERO_POINT``) and, with ``k_blocks``, the tail of K the kernel's block does not
divide (``K_TAIL``: without it those columns contribute nothing, as a kernel looping over whole
blocks only would compute).

No vLLM import here: the unit tier runs this on a CPU with torch alone.

Tolerance rule (``tolerance``)
------------------------------
The kernel differs from this reference only by roundings to the compute dtype
on the way: (1) the first product's output, (2) the activation's output, (3) each
expert's weighted output and (4) the sum over the top-k experts. Its products
accumulate in float32, so the inputs contribute nothing. Each rounding is at most
``u`` (the unit roundoff of the compute precision) relative to the value it
rounds. Rounding (3) and (4) act on values bounded elementwise by
``A = sum_e |w * y_e|`` (the absolute contributions, which the reference returns
as ``magnitude``); (1) and (2) reach the output through the second product, which
mixes every intermediate element into every output element, so their effect is
bounded in size by the token's typical output magnitude, taken as ``rms(A)`` over
that token's row (per row, so tokens with no local expert under an expert map do
not shrink the bound of the others). Hence

    |out - ref| <= C * u * (A + rms(A)),   C = 2 * (4 + r_in)

elementwise, with ``u`` = 2**-8 for bfloat16, 2**-11 for float16 and 2**-11 for
float32 (Triton's ``tl.dot`` takes float32 operands as TF32, 10 explicit bits).
``r_in`` counts roundings of the products' *operands*: 0 for 16-bit inputs (exact
in the compute dtype), 4 for float32 (TF32 rounds x, w13, the activation and
w2), and 8 for wNa16 weights. The factor 2 covers the maximum over thousands of
output elements of errors that are sums of random roundings (a few sigma).

Biases change nothing in the rule: the kernel adds them in float32 to the
accumulator before that accumulator's one rounding (1) or (3), so a biased value
is rounded once like any other, and ``A`` is taken over the biased contributions.
Activations other than silu change the rule only through their sensitivity: a
clamp never amplifies the rounding of its input, GELU and SiTU no more than silu;
``relu2`` and the SwiGLU-OAI forms count one more rounding
(``moegate.kernels.activations.SENSITIVITY`` says why), so for them
``C = 2 * (5 + r_in)``.

fp8_w8a8 (``compare_fp8``)
--------------------------
fp8 quantizes the activations too, inside the call: the input once per call
(per-tensor: one scale for the whole batch; block-wise: one per token and g
columns), and the activation output before the second product. A reference
that re-derives the second quantization from its own intermediate cannot match
the kernel's to the bit: wherever the two intermediates straddle an fp8
rounding step, the operand of the second product differs by a whole step
(2**-3 relative), and on an H200 that put the end-to-end error at up to 30 u
(A + rms A). So the fp8 check goes stage by stage, each on the rounded values
the kernel actually used (the adapter records vLLM's quantized activations):

1. input: the kernel's fp8 input is the round-to-nearest of the input under
   its own scale, within half an fp8 step: ``2**-4 |x| + 2**-10 s`` (s the scale;
   the second term is half the smallest subnormal step);
2. first product and activation: from that fp8 input, the reference's
   activation in float32 against the kernel's quantized one: half an fp8 step
   plus ``C u (|act| + rms act)`` for the roundings of the first product and the
   activation to the compute dtype and the fp8 products' accumulation;
3. second product: from the kernel's quantized activation, the usual rule.

``u`` is bfloat16's for every fp8 case: the modular Triton experts compute fp8
calls in bfloat16 whatever the model dtype (``compute_type`` for an fp8
input). ``r_in`` = ``OPERAND_ROUNDINGS["fp8"]`` counts the fp8 products'
accumulation on tensor cores, which keeps fewer bits than float32 (Hopper:
about 14), as roundings; calibrated on H200 measurements, not derived.
``reference_moe`` with fp8 emulates both quantizations from their definition
(scale = absolute maximum / 448, the largest float8_e4m3fn value); the unit
tier checks it against a dense formulation.

Measured on an H200 with vLLM 0.33.0 (500 generated cases, results/kernels-0.33.0.md): worst
error 4.2 u (A + rms A) for 16-bit unquantized, 6.2 u for float32 (TF32), and
14.6 u for grouped int4/int8 wNa16. The wNa16 allowance (8 operand roundings:
the dequantized w13 and w2 rounded to the compute dtype tile by tile, plus what
the grouped Triton/CUDA kernels add) is calibrated on that measurement rather
than derived; its cause is not established. A dropped or misrouted expert changes
the output by about ``|w * y_e|`` ~ ``A/top_k``, still above the bfloat16 bound
at the element where it is largest (``test_compare_passes_rounding_and_fails_a_dropped_expert``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moegate.core.activation import Activation
from moegate.core.case import Quant
from moegate.kernels import activations
from moegate.kernels.quant import dequantize, dequantize_activation, quantize_activation

W13_BIAS, W2_BIAS = "w13 bias", "w2 bias"
ON_INPUT = "router weight on input"
EXPERT_MAP = "expert map"
ZERO_POINT = "wNa16 zero point"
K_TAIL = "K tail"
LAYER_CONDITIONS = (W13_BIAS, W2_BIAS, ON_INPUT, EXPERT_MAP, ZERO_POINT, K_TAIL)
"""What ``reference_moe(without=...)`` can leave out besides ``activations.CONDITIONS`` (module docstring)."""

DEFAULT_ACTIVATION = Activation()
"""Plain silu (gate half times up half), no parameters: what a case without an activation runs."""

ROUNDINGS = 4
"""Roundings of intermediate values to the compute dtype between input and output."""


OPERAND_ROUNDINGS = {"float32": 4, "wNa16": 8, "fp8": 4, "16-bit": 0}
"""r_in in the tolerance rule: roundings of the products' operands (see module docstring)."""


SPREAD = 2
"""Factor for the maximum over many output elements of sums of random roundings."""


UNIT_ROUNDOFF: dict[torch.dtype, float] = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-11}
"""u per compute dtype; float32's is TF32's (the operands of tl.dot)."""


@dataclass
class Reference:
    """The reference output and the elementwise magnitude the tolerance scales with."""

    output: torch.Tensor  # [M, K] float32
    magnitude: torch.Tensor  # [M, K] float32: sum over routed experts of |w * y_e|


def _expert_weights(
    e: int,
    w1: torch.Tensor,
    w2: torch.Tensor,
    quant: Quant | None,
    w1_scale: torch.Tensor | None,
    w2_scale: torch.Tensor | None,
    zero_point: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    if quant is None:
        return w1[e].float(), w2[e].float()
    assert w1_scale is not None and w2_scale is not None, "quantized weights need their scales"
    return (
        dequantize(w1[e : e + 1], w1_scale[e : e + 1], quant, zero_point=zero_point)[0],
        dequantize(w2[e : e + 1], w2_scale[e : e + 1], quant, zero_point=zero_point)[0],
    )


def _tail(k: int, block: int | None) -> int:
    """The first column of K past the last whole block (``k`` when the block divides it or there is none)."""
    return k if not block or k % block == 0 else k - k % block


@dataclass(frozen=True)
class _Without:
    """``reference_moe``'s ``without`` and ``k_blocks``, read once."""

    act: frozenset[str]
    tails: tuple[int | None, int | None]

    @classmethod
    def of(cls, without: frozenset[str], k_blocks: tuple[int, int] | None) -> _Without:
        unknown = without - set(LAYER_CONDITIONS) - set(activations.CONDITIONS)
        if unknown:
            raise ValueError(f"no reference condition {sorted(unknown)}")
        if K_TAIL in without and k_blocks is None:
            raise ValueError("leaving out the K tail needs the kernel's block sizes (k_blocks)")
        tails = k_blocks if K_TAIL in without and k_blocks is not None else (None, None)
        return cls(without & frozenset(activations.CONDITIONS), tails)

    def first(self, x: torch.Tensor) -> torch.Tensor:
        """The first product's input with the K tail dropped (when asked)."""
        cut = _tail(x.shape[-1], self.tails[0])
        return x if cut == x.shape[-1] else torch.cat((x[..., :cut], torch.zeros_like(x[..., cut:])), dim=-1)

    def second(self, a: torch.Tensor) -> torch.Tensor:
        """The second product's input (the activation) with its K tail dropped (when asked)."""
        cut = _tail(a.shape[-1], self.tails[1])
        return a if cut == a.shape[-1] else torch.cat((a[..., :cut], torch.zeros_like(a[..., cut:])), dim=-1)


def _bias(b: torch.Tensor | None, e: int) -> torch.Tensor | float:
    return 0.0 if b is None else b[e].float()


def _reference_fp8(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    apply_router_weight_on_input: bool,
    quant: Quant,
    w1_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    activation: Activation,
    w1_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    drop: _Without,
) -> Reference:
    """fp8_w8a8: both activations quantized as the module docstring says, in two passes.

    The second quantization's per-tensor scale spans every routed pair, so all
    first products are computed before any second product. The router weight on
    the input scales the first product's output (the kernel quantizes the
    unscaled input and scales its accumulator), which is the same in exact
    arithmetic as scaling the input.
    """
    cdtype = hidden_states.dtype
    m, k = hidden_states.shape
    top_k = ids.shape[1]
    n = w2.shape[2]
    xq = drop.first(quantize_activation(hidden_states, quant))
    act = torch.zeros((m, top_k, n), dtype=torch.float32, device=xq.device)
    experts = torch.unique(ids[ids >= 0]).tolist()
    for e in experts:
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w1e, _ = _expert_weights(e, w1, w2, quant, w1_scale, w2_scale)
        h = xq[tok] @ w1e.T + _bias(w1_bias, e)
        if apply_router_weight_on_input:
            h = h * weights[tok, slot].unsqueeze(1)
        h = h.to(cdtype).float()  # the kernel stores the first product in the compute dtype
        act[tok, slot] = activations.apply(h, activation, drop.act).to(cdtype).float()
    aq = drop.second(quantize_activation(act.reshape(m * top_k, n), quant).reshape(m, top_k, n))
    out = torch.zeros((m, k), dtype=torch.float32, device=xq.device)
    mag = torch.zeros_like(out)
    for e in experts:
        tok, slot = (ids == e).nonzero(as_tuple=True)
        _, w2e = _expert_weights(e, w1, w2, quant, w1_scale, w2_scale)
        y = aq[tok, slot] @ w2e.T + _bias(w2_bias, e)
        if not apply_router_weight_on_input:
            y = y * weights[tok, slot].unsqueeze(1)
        out.index_add_(0, tok, y)
        mag.index_add_(0, tok, y.abs())
    return Reference(out, mag)


def check_ids(topk_ids: torch.Tensor, rows: int, expert_map: torch.Tensor | None = None) -> torch.Tensor:
    """The local row of each routed id (-1: another rank's expert), after checking every id reaches a row.

    Without an expert map, ids index w1's ``rows`` directly (the routed rows, then
    any fused shared rows). With one, ids index the map, which must cover the
    shared ids too, and the map's entries must be rows of w1 or -1.
    """
    ids = topk_ids.long()
    if ids.numel() == 0:
        return ids
    space = rows if expert_map is None else expert_map.numel()
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= space:
        what = f"w1's {rows} rows" if expert_map is None else f"the expert map's {space} entries"
        raise ValueError(
            f"topk_ids span [{lo}, {hi}] but index {what}: fused shared-expert ids need their rows "
            "(and their expert-map entries) after the routed ones"
        )
    if expert_map is None:
        return ids
    local = expert_map.long()[ids]
    if int(local.max()) >= rows or int(local.min()) < -1:
        raise ValueError(f"the expert map sends ids to local rows up to {int(local.max())}, but w1 has {rows} rows")
    return local


def reference_moe(
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    expert_map: torch.Tensor | None = None,
    apply_router_weight_on_input: bool = False,
    quant: Quant | None = None,
    w1_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
    activation: Activation = DEFAULT_ACTIVATION,
    w1_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    without: frozenset[str] = frozenset(),
    k_blocks: tuple[int, int] | None = None,
) -> Reference:
    """The fused-MoE output in float32, looping over the routed local experts.

    One loop step per routed expert (not per pair), so a 128-expert, hidden-2048
    layer costs a few small matmuls on whatever device the inputs are on. ``without``
    (and ``k_blocks``): the conditions to leave out (module docstring).
    """
    drop = _Without.of(without, k_blocks)
    w1_bias = None if W13_BIAS in without else w1_bias
    w2_bias = None if W2_BIAS in without else w2_bias
    apply_router_weight_on_input = apply_router_weight_on_input and ON_INPUT not in without
    zero_point = ZERO_POINT not in without
    x = drop.first(hidden_states.float())
    m, k = x.shape
    if expert_map is not None and EXPERT_MAP in without:
        raw = topk_ids.long()
        ids = torch.where(raw < w1.shape[0], raw, torch.full_like(raw, -1))  # global ids taken as local rows
    else:
        ids = check_ids(topk_ids, w1.shape[0], expert_map)
    weights = topk_weights.float()
    if quant is not None and not quant.weight_only:
        assert w1_scale is not None and w2_scale is not None, "fp8 weights need their scales"
        return _reference_fp8(
            hidden_states,
            w1,
            w2,
            weights,
            ids,
            apply_router_weight_on_input,
            quant,
            w1_scale,
            w2_scale,
            activation,
            w1_bias,
            w2_bias,
            drop,
        )
    out = torch.zeros((m, k), dtype=torch.float32, device=x.device)
    mag = torch.zeros_like(out)
    for e in torch.unique(ids[ids >= 0]).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w1e, w2e = _expert_weights(e, w1, w2, quant, w1_scale, w2_scale, zero_point)
        route = weights[tok, slot].unsqueeze(1)
        h = x[tok] @ w1e.T + _bias(w1_bias, e)
        if apply_router_weight_on_input:
            h = h * route
        y = drop.second(activations.apply(h, activation, drop.act)) @ w2e.T + _bias(w2_bias, e)
        if not apply_router_weight_on_input:
            y = y * route
        out.index_add_(0, tok, y)
        mag.index_add_(0, tok, y.abs())
    return Reference(out, mag)


def rounding_count(dtype: torch.dtype, quant: Quant | None = None, activation: Activation = DEFAULT_ACTIVATION) -> int:
    """C in the tolerance rule: ``SPREAD * (ROUNDINGS + activation's extra roundings + r_in)``."""
    if quant is not None:
        r_in = OPERAND_ROUNDINGS["wNa16" if quant.weight_only else "fp8"]
    elif dtype == torch.float32:
        r_in = OPERAND_ROUNDINGS["float32"]
    else:
        r_in = OPERAND_ROUNDINGS["16-bit"]
    return SPREAD * (ROUNDINGS + activations.SENSITIVITY.get(activation.name, 0) + r_in)


def tolerance(
    ref: Reference, dtype: torch.dtype, quant: Quant | None = None, activation: Activation = DEFAULT_ACTIVATION
) -> torch.Tensor:
    """Elementwise bound ``C * u * (A + rms(A))`` from the module docstring."""
    u = UNIT_ROUNDOFF[dtype]
    a = ref.magnitude
    rms = a.pow(2).mean(dim=-1, keepdim=True).sqrt()  # per token: the second product mixes within a row
    return rounding_count(dtype, quant, activation) * u * (a + rms)


@dataclass
class Closeness:
    """How far a kernel output is from the reference, in units of the tolerance."""

    max_abs_err: float
    worst_ratio: float  # max over elements of |out - ref| / tol; <= 1 passes
    rel_max_err: float  # max |out - ref| / max |ref|, for reports
    ok: bool
    stages: dict[str, float] | None = None  # fp8: worst err/tol of each stage
    worst: tuple[float, float, float] | None = None  # at the worst element: (reference, kernel, tolerance)

    def __str__(self) -> str:
        text = (
            f"max |out-ref|={self.max_abs_err:.3g}, worst err/tol={self.worst_ratio:.3g}, "
            f"rel max err={self.rel_max_err:.3%}"
        )
        if self.stages:
            text += " (" + ", ".join(f"{k} {v:.3g}" for k, v in self.stages.items()) + ")"
        if self.worst is not None:
            ref, out, tol = self.worst
            text += f"\n  at the worst element: reference {ref:.6g}, kernel {out:.6g}, tolerance {tol:.3g}"
        return text


def compare(
    output: torch.Tensor,
    ref: Reference,
    dtype: torch.dtype,
    quant: Quant | None = None,
    activation: Activation = DEFAULT_ACTIVATION,
) -> Closeness:
    """Compare a kernel output with the reference under the tolerance rule."""
    err = (output.float() - ref.output).abs()
    tol = tolerance(ref, dtype, quant, activation).expand_as(err)
    ratios = err / tol.clamp_min(torch.finfo(torch.float32).tiny)
    ratio = ratios.max().item() if err.numel() else 0.0
    finite = bool(torch.isfinite(output.float()).all())
    peak = ref.output.abs().max().item() if err.numel() else 0.0
    max_err = err.max().item() if err.numel() else 0.0
    worst = None
    if err.numel():  # where the failure page points: the element furthest outside (or nearest) its bound
        at = int(ratios.nan_to_num(float("inf")).flatten().argmax())
        worst = (ref.output.flatten()[at].item(), output.float().flatten()[at].item(), tol.flatten()[at].item())
    return Closeness(max_err, ratio, max_err / peak if peak else max_err, finite and ratio <= 1.0, worst=worst)


FP8_HALF_STEP = 2.0**-4
"""Round-to-nearest into float8_e4m3fn (3 mantissa bits) moves a normal value by at most this, relatively."""


FP8_SUBNORMAL_HALF_STEP = 2.0**-10
"""Half the smallest subnormal float8_e4m3fn step (2**-9), times the scale: the absolute floor."""


FP8_COMPUTE_DTYPE = torch.bfloat16
"""fp8 calls are checked at bfloat16's unit roundoff (see the module docstring)."""


def _staged_ratio(err: torch.Tensor, bound: torch.Tensor) -> float:
    if err.numel() == 0:
        return 0.0
    ratio = (err / bound.clamp_min(torch.finfo(torch.float32).tiny)).max().item()
    return ratio if torch.isfinite(err).all() else float("inf")


def compare_fp8(
    output: torch.Tensor,
    hidden_states: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    quant: Quant,
    w1_scale: torch.Tensor,
    w2_scale: torch.Tensor,
    quantized: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    expert_map: torch.Tensor | None = None,
    apply_router_weight_on_input: bool = False,
    activation: Activation = DEFAULT_ACTIVATION,
    w1_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
) -> Closeness:
    """The three-stage fp8 check of the module docstring; ``quantized`` is [(input q, s), (activation q, s)]."""
    if len(quantized) < 2:
        raise AssertionError(
            f"fp8 call recorded {len(quantized)} quantized activations, expected the input and the intermediate"
        )
    g = quant.group_size
    m, k = hidden_states.shape
    top_k = topk_ids.shape[1]
    n = w2.shape[2]
    u = UNIT_ROUNDOFF[FP8_COMPUTE_DTYPE]
    c = SPREAD * (ROUNDINGS + activations.SENSITIVITY.get(activation.name, 0) + OPERAND_ROUNDINGS["fp8"])
    ids = check_ids(topk_ids, w1.shape[0], expert_map)
    weights = topk_weights.float()

    # 1. the kernel's fp8 input is a rounding of the input
    (q_in, s_in), (q_mid, s_mid) = quantized[0], quantized[1]
    x = hidden_states.float()
    xk, xs = dequantize_activation(q_in.reshape(m, k), s_in, g)
    r_input = _staged_ratio((xk - x).abs(), (FP8_HALF_STEP * x.abs() + FP8_SUBNORMAL_HALF_STEP * xs) * 1.01)

    # 2. first product and activation, from the kernel's fp8 input
    act_ref = torch.zeros((m, top_k, n), dtype=torch.float32, device=x.device)
    experts = torch.unique(ids[ids >= 0]).tolist()
    for e in experts:
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w1e = dequantize(w1[e : e + 1], w1_scale[e : e + 1], quant)[0]
        h = xk[tok] @ w1e.T + _bias(w1_bias, e)
        if apply_router_weight_on_input:
            h = h * weights[tok, slot].unsqueeze(1)
        act_ref[tok, slot] = activations.apply(h, activation)
    mid, mid_s = dequantize_activation(q_mid.reshape(m * top_k, n), s_mid, g)
    mid, mid_s = mid.reshape(m, top_k, n), mid_s.reshape(m, top_k, n)
    valid = ids >= 0  # remote pairs: never written (legacy) or zero (modular); not the kernel's output
    a = act_ref[valid]
    rms = a.pow(2).mean(dim=-1, keepdim=True).sqrt()
    bound = FP8_HALF_STEP * a.abs() + FP8_SUBNORMAL_HALF_STEP * mid_s[valid] + c * u * (a.abs() + rms)
    r_mid = _staged_ratio((mid[valid] - a).abs(), bound)

    # 3. second product, from the kernel's quantized activation
    out = torch.zeros((m, k), dtype=torch.float32, device=x.device)
    mag = torch.zeros_like(out)
    for e in experts:
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w2e = dequantize(w2[e : e + 1], w2_scale[e : e + 1], quant)[0]
        y = mid[tok, slot] @ w2e.T + _bias(w2_bias, e)
        if not apply_router_weight_on_input:
            y = y * weights[tok, slot].unsqueeze(1)
        out.index_add_(0, tok, y)
        mag.index_add_(0, tok, y.abs())
    err = (output.float() - out).abs()
    tol = c * u * (mag + mag.pow(2).mean(dim=-1, keepdim=True).sqrt())
    r_out = _staged_ratio(err, tol)

    stages = {"input": r_input, "first product": r_mid, "second product": r_out}
    worst = max(stages.values())
    finite = bool(torch.isfinite(output.float()).all())
    peak = out.abs().max().item() if out.numel() else 0.0
    max_err = err.max().item() if err.numel() else 0.0
    return Closeness(max_err, worst, max_err / peak if peak else max_err, finite and worst <= 1.0, stages)
