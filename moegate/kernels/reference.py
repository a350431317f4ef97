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

The tolerance the kernel tier compares with, and the comparison: ``moegate.kernels.tolerance``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moegate.core.activation import Activation
from moegate.core.case import Quant
from moegate.kernels import activations
from moegate.kernels.quant import dequantize, quantize_activation

W13_BIAS, W2_BIAS = "w13 bias", "w2 bias"
ON_INPUT = "router weight on input"
EXPERT_MAP = "expert map"
ZERO_POINT = "wNa16 zero point"
K_TAIL = "K tail"
LAYER_CONDITIONS = (W13_BIAS, W2_BIAS, ON_INPUT, EXPERT_MAP, ZERO_POINT, K_TAIL)
"""What ``reference_moe(without=...)`` can leave out besides ``activations.CONDITIONS`` (module docstring)."""

DEFAULT_ACTIVATION = Activation()
"""Plain silu (gate half times up half), no parameters: what a case without an activation runs."""


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


def expert_bias(b: torch.Tensor | None, e: int) -> torch.Tensor | float:
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
    a_scales: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None),
) -> Reference:
    """fp8_w8a8: both activations quantized as the module docstring says, in two passes.

    ``a_scales``: static activation scales of the input and of the activation (None: dynamic).

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
    xq = drop.first(quantize_activation(hidden_states, quant, a_scales[0]))
    act = torch.zeros((m, top_k, n), dtype=torch.float32, device=xq.device)
    experts = torch.unique(ids[ids >= 0]).tolist()
    for e in experts:
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w1e, _ = _expert_weights(e, w1, w2, quant, w1_scale, w2_scale)
        h = xq[tok] @ w1e.T + expert_bias(w1_bias, e)
        if apply_router_weight_on_input:
            h = h * weights[tok, slot].unsqueeze(1)
        h = h.to(cdtype).float()  # the kernel stores the first product in the compute dtype
        act[tok, slot] = activations.apply(h, activation, drop.act).to(cdtype).float()
    aq = drop.second(quantize_activation(act.reshape(m * top_k, n), quant, a_scales[1]).reshape(m, top_k, n))
    out = torch.zeros((m, k), dtype=torch.float32, device=xq.device)
    mag = torch.zeros_like(out)
    for e in experts:
        tok, slot = (ids == e).nonzero(as_tuple=True)
        _, w2e = _expert_weights(e, w1, w2, quant, w1_scale, w2_scale)
        y = aq[tok, slot] @ w2e.T + expert_bias(w2_bias, e)
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
    a1_scale: torch.Tensor | None = None,
    a2_scale: torch.Tensor | None = None,
) -> Reference:
    """The fused-MoE output in float32, looping over the routed local experts.

    ``a1_scale``, ``a2_scale``: fp8's static activation scales (``moegate.kernels.quant.fp8_quantize``).

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
            (a1_scale, a2_scale),
        )
    out = torch.zeros((m, k), dtype=torch.float32, device=x.device)
    mag = torch.zeros_like(out)
    for e in torch.unique(ids[ids >= 0]).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w1e, w2e = _expert_weights(e, w1, w2, quant, w1_scale, w2_scale, zero_point)
        route = weights[tok, slot].unsqueeze(1)
        h = x[tok] @ w1e.T + expert_bias(w1_bias, e)
        if apply_router_weight_on_input:
            h = h * route
        y = drop.second(activations.apply(h, activation, drop.act)) @ w2e.T + expert_bias(w2_bias, e)
        if not apply_router_weight_on_input:
            y = y * route
        out.index_add_(0, tok, y)
        mag.index_add_(0, tok, y.abs())
    return Reference(out, mag)
