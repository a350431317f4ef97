"""The experts' activations in float32, written from their definitions (not from vLLM's kernels).

w13's product ``h`` (``[pairs, w13_rows]``) becomes the second product's input
(``[pairs, N]``). A gated activation splits ``h`` into a gate and an up part and
multiplies: ``act(gate) * up``; an ungated one (``*_no_mul``) maps every element of
``h`` alone. For every gated activation but one the gate is the first half of the
rows and up the second (w13 stacks the two projections); gpt-oss's ``swigluoai``
interleaves them (gate, up, gate, up...), as its checkpoints store them.

The definitions, with ``L`` the clamp limit, ``a`` alpha and ``b`` beta:

- ``silu``: ``silu(gate) * up``; with a limit: ``silu(min(gate, L)) * clamp(up, -L, L)``;
- ``gelu`` / ``gelu_tanh``: ``gelu(gate) * up``, exact (erf) or tanh-approximated;
- ``swigluoai`` (interleaved, fixed ``L = 7``, ``a = 1.702``): with ``g = min(gate, L)``,
  ``g * sigmoid(a * g) * (clamp(up, -L, L) + 1)``;
- ``swigluoai_uninterleave`` (halves, ``L`` required, ``a`` default 1, ``b`` default 0): with
  ``g = min(gate, L)``, ``g * sigmoid(a * g) * (clamp(up, -L, L) + b)``;
- ``swiglustep`` (fixed ``L = 7``): ``min(silu(gate), L) * clamp(up, -L, L)``: the gate is
  clamped after the silu, not before;
- ``situ`` (``b`` = situ_beta, required; ``c`` = situ_linear_beta, optional):
  ``b * tanh(gate / b) * sigmoid(gate) * u`` with ``u = c * tanh(up / c)`` when ``c`` is given, else ``up``;
- ``silu_no_mul``, ``gelu_no_mul``, ``gelu_tanh_no_mul``: the function of each element;
  ``relu2_no_mul``: ``max(h, 0) ** 2``.

Where the limits come from: vLLM's layer hands ``swiglu_limit``, ``swiglu_alpha``,
``swiglu_beta`` and SiTU's betas to the experts through its config; ``swigluoai`` and
``swiglustep`` are called without parameters and use 7.0 and 1.702, the defaults of
vLLM's own SwiGLU-OAI and SwiGLU-step activations (the gpt-oss values).

``SENSITIVITY`` is what the tolerance rule needs from each (``moegate.kernels.tolerance``).

``apply(h, act, without=...)`` leaves out the named parts of the definition (``CONDITIONS``): the
reach report (``moegate.kernels.conditions``) asks whether a case's result would differ without
each, i.e. whether the case made that part matter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moegate.core.activation import Activation

FIXED_LIMIT = 7.0
"""The clamp limit of ``swigluoai`` and ``swiglustep``, which vLLM calls without one."""

SWIGLUOAI_ALPHA = 1.702
"""``swigluoai``'s sigmoid scale (gpt-oss)."""

INTERLEAVED = frozenset({"swigluoai"})
"""Gated activations whose w13 rows alternate gate and up."""

GATE_CLAMP = "gate clamp"
"""``min(gate, L)`` (silu with a limit, the SwiGLU-OAI forms)."""
UP_CLAMP = "up clamp"
"""``clamp(up, -L, L)`` (silu with a limit, the SwiGLU-OAI forms, swiglustep)."""
STEP_CLAMP = "step clamp"
"""swiglustep's ``min(silu(gate), 7)``: the clamp after the function."""
SITU_GATE = "situ gate soft clip"
"""SiTU's ``b * tanh(gate / b)`` in place of the gate."""
SITU_UP = "situ up soft clip"
"""SiTU's ``c * tanh(up / c)`` in place of up (with ``situ_linear_beta``)."""
SWIGLU_ALPHA = "swiglu alpha"
"""The SwiGLU-OAI forms' sigmoid scale ``a`` (without it: 1)."""
SWIGLU_BETA = "swiglu beta"
"""The SwiGLU-OAI forms' up offset ``b`` (without it: 0)."""
CONDITIONS = (GATE_CLAMP, UP_CLAMP, STEP_CLAMP, SITU_GATE, SITU_UP, SWIGLU_ALPHA, SWIGLU_BETA)
"""The parts of the activations' definitions ``apply`` can leave out."""


def conditions(act: Activation) -> tuple[str, ...]:
    """The ``CONDITIONS`` that are part of ``act``'s definition."""
    name = act.name
    if name == "silu":
        return (GATE_CLAMP, UP_CLAMP) if act.limit is not None else ()
    if name == "swigluoai":
        return (GATE_CLAMP, UP_CLAMP, SWIGLU_ALPHA, SWIGLU_BETA)
    if name == "swigluoai_uninterleave":
        return (
            (GATE_CLAMP, UP_CLAMP)
            + ((SWIGLU_ALPHA,) if act.alpha not in (None, 1.0) else ())
            + ((SWIGLU_BETA,) if act.beta not in (None, 0.0) else ())
        )
    if name == "swiglustep":
        return (STEP_CLAMP, UP_CLAMP)
    if name == "situ":
        return (SITU_GATE,) + ((SITU_UP,) if act.situ_linear_beta is not None else ())
    return ()


SENSITIVITY: dict[str, int] = {"relu2_no_mul": 1, "swigluoai": 1, "swigluoai_uninterleave": 1}
"""Extra roundings the tolerance counts for an activation (0 when absent).

The rule (``moegate.kernels.tolerance``) bounds the effect of rounding the first
product's output ``h`` by ``u`` relative to the activation's value. That holds when the
activation is 1-Lipschitz in the relative sense: silu, gelu, the clamps (which never
amplify a change) and SiTU's tanh and sigmoid. Two kinds of activation break it by a
factor of about two, so they count one more rounding: ``relu2`` doubles a relative change
(``d(h^2)/h^2 = 2 dh/h``); the SwiGLU-OAI forms multiply by ``up + 1`` (or ``up + b``), where
a rounding of ``up`` is relative to ``|up|``, not to ``|up + 1|``: with the O(1) products
the kernel tier draws, ``rms(|up|)`` stays within ``rms(|up + 1|) + 1``, about twice it.
"""


def split(h: torch.Tensor, act: Activation) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) of a gated activation's input rows."""
    if act.name in INTERLEAVED:
        return h[..., 0::2], h[..., 1::2]
    n = h.shape[-1] // 2
    return h[..., :n], h[..., n:]


def apply(h: torch.Tensor, act: Activation, without: frozenset[str] = frozenset()) -> torch.Tensor:
    """The activation of ``h`` in float32 (see the module docstring), less the ``CONDITIONS`` in ``without``."""
    h = h.float()
    unknown = without - set(CONDITIONS)
    if unknown:
        raise ValueError(f"no activation condition {sorted(unknown)}; known: {CONDITIONS}")

    def gate_clamp(x: torch.Tensor, limit: float) -> torch.Tensor:
        return x if GATE_CLAMP in without else x.clamp(max=limit)

    def up_clamp(x: torch.Tensor, limit: float) -> torch.Tensor:
        return x if UP_CLAMP in without else x.clamp(-limit, limit)

    name = act.name
    if not act.gated:
        if name == "silu_no_mul":
            return F.silu(h)
        if name == "gelu_no_mul":
            return F.gelu(h)
        if name == "gelu_tanh_no_mul":
            return F.gelu(h, approximate="tanh")
        if name == "relu2_no_mul":
            return F.relu(h).square()
        raise ValueError(f"no reference for activation {name!r}")
    gate, up = split(h, act)
    if name == "silu":
        if act.limit is not None:
            gate, up = gate_clamp(gate, act.limit), up_clamp(up, act.limit)
        return F.silu(gate) * up
    if name == "gelu":
        return F.gelu(gate) * up
    if name == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    if name in ("swigluoai", "swigluoai_uninterleave"):
        fixed = name == "swigluoai"
        limit = FIXED_LIMIT if fixed else act.limit
        assert limit is not None  # Activation requires it for swigluoai_uninterleave
        alpha = SWIGLUOAI_ALPHA if fixed else (1.0 if act.alpha is None else act.alpha)
        beta = 1.0 if fixed else (0.0 if act.beta is None else act.beta)
        alpha = 1.0 if SWIGLU_ALPHA in without else alpha
        beta = 0.0 if SWIGLU_BETA in without else beta
        g = gate_clamp(gate, limit)
        return g * torch.sigmoid(alpha * g) * (up_clamp(up, limit) + beta)
    if name == "swiglustep":
        s = F.silu(gate)
        return (s if STEP_CLAMP in without else s.clamp(max=FIXED_LIMIT)) * up_clamp(up, FIXED_LIMIT)
    if name == "situ":
        situ_beta = act.situ_beta
        assert situ_beta is not None  # Activation requires it
        soft = gate if SITU_GATE in without else situ_beta * torch.tanh(gate / situ_beta)
        g = soft * torch.sigmoid(gate)
        c = act.situ_linear_beta
        return g * (c * torch.tanh(up / c) if c is not None and SITU_UP not in without else up)
    raise ValueError(f"no reference for activation {name!r}")


def clamp_limits(act: Activation) -> tuple[float | None, float | None]:
    """(limit on the gate, limit on up) the activation clamps its input at, None where it does not clamp its input."""
    if act.name == "silu" and act.limit is not None:
        return act.limit, act.limit
    if act.name == "swigluoai":
        return FIXED_LIMIT, FIXED_LIMIT
    if act.name == "swigluoai_uninterleave":
        return act.limit, act.limit
    if act.name == "swiglustep":
        return None, FIXED_LIMIT  # its gate limit applies to silu(gate), after the function
    return None, None


INPUT_GAIN = 8.0
"""Scale of the kernel tier's hidden states for a clamping activation (``input_gain``), on every other token.

The tier's weights make the first product's output about N(0, 1); a clamp at 7 or 10
would then almost never bind and the clamp would go untested. Scaled by 8, the output
is about N(0, 64): a limit of 7 clamps some 38 % of inputs, 10 about 21 %, 0.5 nearly all.
At that scale the SwiGLU-OAI forms' sigmoid is saturated wherever the gate is not near 0,
and their ``alpha`` can no longer change the result beyond the tolerance: so only the even
tokens (the first, the third...) are scaled, the odd ones stay at unit scale
(``token_gains``), and one call makes both the clamps and ``alpha`` matter."""


def input_gain(act: Activation) -> float:
    """How much the kernel tier scales its hidden states for ``act`` (``INPUT_GAIN`` where it clamps, else 1)."""
    gate_limit, up_limit = clamp_limits(act)
    return INPUT_GAIN if gate_limit is not None or up_limit is not None else 1.0


def token_gains(act: Activation, tokens: int) -> list[float]:
    """Each token's scale (``INPUT_GAIN``'s docstring): ``input_gain`` on even tokens, 1 on odd ones."""
    gain = input_gain(act)
    return [gain if i % 2 == 0 else 1.0 for i in range(tokens)]
