"""The tolerance the kernel tier compares a fused-MoE output with, and the comparison, against ``moegate.kernels.reference``.

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

Stages 1 and 2 compare with the value saturated at the fp8 range of its scale
(``448 s``): a static activation scale (``Quant.static_scales``) can be smaller than
a value needs, and the quantizer then clamps it; a dynamic scale covers every value,
so there the saturation changes nothing.

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
from moegate.kernels.quant import FP8_MAX, dequantize, dequantize_activation
from moegate.kernels.reference import DEFAULT_ACTIVATION, Reference, check_ids, expert_bias

ROUNDINGS = 4
"""Roundings of intermediate values to the compute dtype between input and output."""


OPERAND_ROUNDINGS = {"float32": 4, "wNa16": 8, "fp8": 4, "16-bit": 0}
"""r_in in the tolerance rule: roundings of the products' operands (see module docstring)."""


SPREAD = 2
"""Factor for the maximum over many output elements of sums of random roundings."""


UNIT_ROUNDOFF: dict[torch.dtype, float] = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-11}
"""u per compute dtype; float32's is TF32's (the operands of tl.dot)."""


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


def _saturated(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` clamped to the fp8 range under its per-element ``scale`` (the module docstring's saturation)."""
    top = FP8_MAX * scale
    return torch.minimum(torch.maximum(x, -top), top)


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
    x = _saturated(x, xs)
    r_input = _staged_ratio((xk - x).abs(), (FP8_HALF_STEP * x.abs() + FP8_SUBNORMAL_HALF_STEP * xs) * 1.01)

    # 2. first product and activation, from the kernel's fp8 input
    act_ref = torch.zeros((m, top_k, n), dtype=torch.float32, device=x.device)
    experts = torch.unique(ids[ids >= 0]).tolist()
    for e in experts:
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w1e = dequantize(w1[e : e + 1], w1_scale[e : e + 1], quant)[0]
        h = xk[tok] @ w1e.T + expert_bias(w1_bias, e)
        if apply_router_weight_on_input:
            h = h * weights[tok, slot].unsqueeze(1)
        act_ref[tok, slot] = activations.apply(h, activation)
    mid, mid_s = dequantize_activation(q_mid.reshape(m * top_k, n), s_mid, g)
    mid, mid_s = mid.reshape(m, top_k, n), mid_s.reshape(m, top_k, n)
    valid = ids >= 0  # remote pairs: never written (legacy) or zero (modular); not the kernel's output
    a = _saturated(act_ref[valid], mid_s[valid])
    rms = a.pow(2).mean(dim=-1, keepdim=True).sqrt()
    bound = FP8_HALF_STEP * a.abs() + FP8_SUBNORMAL_HALF_STEP * mid_s[valid] + c * u * (a.abs() + rms)
    r_mid = _staged_ratio((mid[valid] - a).abs(), bound)

    # 3. second product, from the kernel's quantized activation
    out = torch.zeros((m, k), dtype=torch.float32, device=x.device)
    mag = torch.zeros_like(out)
    for e in experts:
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w2e = dequantize(w2[e : e + 1], w2_scale[e : e + 1], quant)[0]
        y = mid[tok, slot] @ w2e.T + expert_bias(w2_bias, e)
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
