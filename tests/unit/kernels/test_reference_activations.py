"""The reference's activations and biases against hand-derived single-pair cases (CPU, float32).

Each case routes one token to one expert with one hidden and one intermediate
element, so every number below is a closed form written with ``math`` alone:
``h`` is the first product's output (gate and up), the activation is applied by
hand, and the second product is a scalar multiply. The reference must agree to
float32 rounding; a swapped gate and up, a clamp on the wrong side or after the
function instead of before, a missing ``+ 1``, a bias scaled by the router weight
where the kernel does not scale it, each shows as an O(1) difference.
"""

from __future__ import annotations

import math

import pytest
import torch

from moegate.core.activation import ACTIVATIONS, Activation
from moegate.core.case import MoECase
from moegate.kernels import activations
from moegate.kernels.reference import Reference, reference_moe
from moegate.kernels.tolerance import compare, rounding_count


def sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def silu(v: float) -> float:
    return v * sigmoid(v)


def gelu(v: float) -> float:
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def gelu_tanh(v: float) -> float:
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))


X, W2, ROUTE = 2.0, 0.75, 0.4
"""The token's one hidden element, w2's one element, the router weight."""


def one_pair(
    rows: list[float], act: Activation, b1: list[float] | None = None, b2: float | None = None, on_input=False
):
    """The reference for one token routed to one expert whose w13 column is ``rows`` (so h = X * rows + b1)."""
    x = torch.tensor([[X]])
    w1 = torch.tensor(rows).reshape(1, len(rows), 1)
    w2 = torch.tensor([[[W2]]])
    ref = reference_moe(
        x, w1, w2, torch.tensor([[ROUTE]]), torch.tensor([[0]], dtype=torch.int32),
        activation=act, apply_router_weight_on_input=on_input,
        w1_bias=None if b1 is None else torch.tensor([b1]), w2_bias=None if b2 is None else torch.tensor([[b2]]),
    )  # fmt: skip
    return ref.output.item()


@pytest.mark.parametrize(
    "act,rows,by_hand",
    [
        # h = X * rows: gate 3, up -1 (gated activations stack the gate half over the up half)
        (Activation("silu"), [1.5, -0.5], silu(3.0) * -1.0),
        (Activation("gelu"), [1.5, -0.5], gelu(3.0) * -1.0),
        (Activation("gelu_tanh"), [1.5, -0.5], gelu_tanh(3.0) * -1.0),
        # the clamp binds: gate 9 -> 7 before the silu, up -9 -> -7
        (Activation("silu", limit=7.0), [4.5, -4.5], silu(7.0) * -7.0),
        # and a gate below the limit is left alone; only up is clamped from below
        (Activation("silu", limit=2.0), [-1.5, 4.0], silu(-3.0) * 2.0),
        # swigluoai interleaves (gate, up): rows [g, u]; limit 7, alpha 1.702, (up + 1)
        (Activation("swigluoai"), [4.5, 0.5], 7.0 * sigmoid(1.702 * 7.0) * (1.0 + 1.0)),
        (Activation("swigluoai"), [0.5, -5.0], 1.0 * sigmoid(1.702) * (-7.0 + 1.0)),
        # swigluoai_uninterleave: halves; its own limit, alpha and beta
        (Activation("swigluoai_uninterleave", limit=1.0, alpha=1.702, beta=1.0), [1.5, 0.25], sigmoid(1.702) * 1.5),
        (Activation("swigluoai_uninterleave", limit=10.0), [1.5, 0.25], 3.0 * sigmoid(3.0) * 0.5),
        # swiglustep clamps silu(gate) at 7, after the function: silu(9) = 8.999 -> 7
        (Activation("swiglustep"), [4.5, 1.0], 7.0 * 2.0),
        (Activation("swiglustep"), [1.0, -4.0], silu(2.0) * -7.0),
        # SiTU: beta * tanh(gate / beta) * sigmoid(gate) * up, up soft-clipped when linear_beta is given
        (Activation("situ", situ_beta=1.0), [1.5, -0.5], math.tanh(3.0) * sigmoid(3.0) * -1.0),
        (
            Activation("situ", situ_beta=4.0, situ_linear_beta=2.0),
            [1.5, 2.0],
            4.0 * math.tanh(0.75) * sigmoid(3.0) * 2.0 * math.tanh(2.0),
        ),
        # ungated: w13 has N rows, each element mapped alone
        (Activation("silu_no_mul"), [1.5], silu(3.0)),
        (Activation("gelu_no_mul"), [-0.5], gelu(-1.0)),
        (Activation("gelu_tanh_no_mul"), [1.5], gelu_tanh(3.0)),
        (Activation("relu2_no_mul"), [1.5], 9.0),
        (Activation("relu2_no_mul"), [-1.5], 0.0),
    ],
    ids=lambda v: v.label if isinstance(v, Activation) else None,
)
def test_each_activation_matches_its_hand_derived_value(act, rows, by_hand):
    assert one_pair(rows, act) == pytest.approx(ROUTE * W2 * by_hand, rel=1e-6, abs=1e-7)


def test_every_activation_vllm_accepts_has_a_hand_derived_case():
    """The table above covers the case model's whole activation list (the census's Triton activations)."""
    (mark,) = [m for m in test_each_activation_matches_its_hand_derived_value.pytestmark if m.name == "parametrize"]
    assert {case[0].name for case in mark.args[1]} == set(ACTIVATIONS)


def test_biases_are_added_before_the_activation_and_after_the_second_product_then_weighted():
    # h = X * [1.5, -0.5] + [-1, 2] = [2, 1]; y = silu(2) * 1 * W2 + 0.5; out = ROUTE * y
    got = one_pair([1.5, -0.5], Activation(), b1=[-1.0, 2.0], b2=0.5)
    assert got == pytest.approx(ROUTE * (silu(2.0) * 1.0 * W2 + 0.5), rel=1e-6)


def test_the_router_weight_on_the_input_scales_the_biased_first_product_and_not_the_second():
    # the kernel multiplies the first product's accumulator (bias included) by the weight: h = ROUTE * [2, 1]
    got = one_pair([1.5, -0.5], Activation(), b1=[-1.0, 2.0], b2=0.5, on_input=True)
    assert got == pytest.approx(silu(2.0 * ROUTE) * (1.0 * ROUTE) * W2 + 0.5, rel=1e-6)


def test_the_interleaved_layout_is_not_the_halves_layout():
    """Same rows, same limit and alpha: gpt-oss's interleaving changes which row is the gate."""
    rows = [1.0, 2.0, -1.0, 0.5]  # interleaved: gates 2, -2; up 4, 1 | halves: gates 2, 4; up -2, 1
    a = activations.apply(torch.tensor([rows]) * X, Activation("swigluoai"))
    b = activations.apply(
        torch.tensor([rows]) * X, Activation("swigluoai_uninterleave", limit=7.0, alpha=1.702, beta=1.0)
    )
    assert (a - b).abs().max() > 0.5


def test_the_clamps_bind_at_the_kernel_tiers_input_scale():
    """With the tier's input gain a limited activation clamps a real share of its inputs (else it tests nothing)."""
    gen = torch.Generator().manual_seed(0)
    for act in (Activation("swigluoai"), Activation("silu", limit=10.0), Activation("swiglustep")):
        h = torch.randn(4096, generator=gen) * activations.input_gain(act)
        gate_limit, up_limit = activations.clamp_limits(act)
        limit = up_limit if gate_limit is None else gate_limit
        assert limit is not None and float((h.abs() > limit).float().mean()) > 0.1, act.label
    assert activations.input_gain(Activation()) == 1.0


def test_relu2_and_the_swiglu_oai_forms_count_one_more_rounding():
    base = rounding_count(torch.bfloat16)
    assert rounding_count(torch.bfloat16, activation=Activation("relu2_no_mul")) == base + 2
    assert rounding_count(torch.bfloat16, activation=Activation("swigluoai")) == base + 2
    assert rounding_count(torch.bfloat16, activation=Activation("gelu")) == base


def test_compare_passes_bfloat16_rounding_and_fails_a_dropped_bias():
    """A kernel that rounded everything to bfloat16 passes; one that forgot w2's bias fails."""
    gen = torch.Generator().manual_seed(1)
    e, m, k, n = 4, 6, 32, 16
    x = torch.randn(m, k, generator=gen)
    w1 = torch.randn(e, 2 * n, k, generator=gen) / math.sqrt(k)
    w2 = torch.randn(e, k, n, generator=gen) / math.sqrt(n)
    b1, b2 = torch.randn(e, 2 * n, generator=gen), torch.randn(e, k, generator=gen)
    ids = torch.stack([torch.randperm(e, generator=gen)[:2] for _ in range(m)]).to(torch.int32)
    w = torch.full((m, 2), 0.5)
    act = Activation("swigluoai")
    ref = reference_moe(x, w1, w2, w, ids, activation=act, w1_bias=b1, w2_bias=b2)
    rounded = ref.output.to(torch.bfloat16)
    assert compare(rounded, ref, torch.bfloat16, activation=act).ok
    no_b2 = reference_moe(x, w1, w2, w, ids, activation=act, w1_bias=b1)
    verdict = compare(no_b2.output.to(torch.bfloat16), ref, torch.bfloat16, activation=act)
    assert not verdict.ok, verdict


def test_an_ungated_case_gives_w13_n_rows_and_a_gated_one_2n():
    assert MoECase(1, 1, 8, intermediate=64, activation=Activation("relu2_no_mul")).w13_rows == 64
    assert MoECase(1, 1, 8, intermediate=64, activation=Activation("swigluoai")).w13_rows == 128


def test_magnitude_includes_the_biases():
    ref = Reference(torch.zeros(1, 1), torch.ones(1, 1))
    assert ref.magnitude.item() == 1.0
    got = reference_moe(
        torch.zeros(1, 1), torch.zeros(1, 2, 1), torch.zeros(1, 1, 1), torch.tensor([[1.0]]),
        torch.tensor([[0]], dtype=torch.int32), w2_bias=torch.tensor([[3.0]]),
    )  # fmt: skip
    assert got.output.item() == 3.0 and got.magnitude.item() == 3.0
