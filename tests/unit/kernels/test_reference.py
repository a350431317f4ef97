"""The torch reference against an independent dense formulation, and its metamorphic properties.

Runs on a CPU with torch alone (the unit tier): float32 throughout, so the two
formulations agree to float32 rounding and any structural slip (wrong half of
w13 as the gate, weight applied twice, remote expert counted) shows as O(1).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from moegate.core.case import SHARED_EXPERT_WEIGHT, ExpertMap, Quant
from moegate.kernels.quant import dequantize, unpack_int4
from moegate.kernels.reference import Reference, reference_moe
from moegate.kernels.tolerance import compare, tolerance


def dense_moe(x, w1, w2, topk_weights, topk_ids, expert_map=None, on_input=False):
    """Every token through every expert, then a one-hot combine: no loop, no indexing by expert."""
    e_local = w1.shape[0]
    ids = topk_ids.long()
    if expert_map is not None:
        ids = expert_map.long()[ids]
    valid = ids >= 0
    onehot = F.one_hot(ids.clamp_min(0), e_local).float() * valid.unsqueeze(-1)  # [M, k, E]
    gate = torch.einsum("mke,mk->me", onehot, topk_weights.float())  # [M, E] router weight per expert
    n = w1.shape[1] // 2
    if on_input:
        xin = torch.einsum("mk,me->mek", x.float(), gate)  # x scaled per (token, expert)
        h = torch.einsum("mek,enk->men", xin, w1.float())
        y = torch.einsum("men,ekn->mek", F.silu(h[..., :n]) * h[..., n:], w2.float())
        return torch.einsum("mek,me->mk", y, (gate != 0).float())
    h = torch.einsum("mk,enk->men", x.float(), w1.float())
    y = torch.einsum("men,ekn->mek", F.silu(h[..., :n]) * h[..., n:], w2.float())
    return torch.einsum("mek,me->mk", y, gate)


@st.composite
def problems(draw, on_input=None):
    e = draw(st.integers(2, 12))
    k = draw(st.integers(1, min(4, e)))
    if on_input is None:
        on_input = k == 1 and draw(st.booleans())
    m = draw(st.integers(1, 9))
    hid, inter = draw(st.sampled_from([8, 16])), draw(st.sampled_from([4, 8]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, hid, generator=g)
    w1 = torch.randn(e, 2 * inter, hid, generator=g) / math.sqrt(hid)
    w2 = torch.randn(e, hid, inter, generator=g) / math.sqrt(inter)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]).to(torch.int32)
    w = torch.rand(m, k, generator=g) + 0.05
    w = w / w.sum(-1, keepdim=True)
    return x, w1, w2, w, ids, on_input


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@given(problems())
def test_reference_equals_dense_formulation(p):
    x, w1, w2, w, ids, on_input = p
    ref = reference_moe(x, w1, w2, w, ids, apply_router_weight_on_input=on_input)
    close(ref.output, dense_moe(x, w1, w2, w, ids, on_input=on_input))


@given(problems(), st.data())
def test_expert_map_remote_experts_contribute_zero(p, data):
    """Rank r's output equals the dense output over only its experts, and the ranks sum to the whole."""
    x, w1, w2, w, ids, on_input = p
    e = w1.shape[0]
    size = data.draw(st.integers(1, e))
    total = torch.zeros(x.shape[0], x.shape[1])
    for rank in range(size):
        em = ExpertMap(size, rank)
        start, end = em.local_range(e)
        emap = torch.tensor(em.as_list(e), dtype=torch.int32)
        part = reference_moe(
            x, w1[start:end], w2[start:end], w, ids, expert_map=emap, apply_router_weight_on_input=on_input
        ).output
        mask = torch.zeros(e)
        mask[start:end] = 1
        close(part, dense_moe(x, w1 * mask[:, None, None], w2 * mask[:, None, None], w, ids, on_input=on_input))
        total += part
    close(total, reference_moe(x, w1, w2, w, ids, apply_router_weight_on_input=on_input).output)


@given(problems(), st.randoms(use_true_random=False))
def test_permuting_tokens_permutes_outputs(p, rnd):
    x, w1, w2, w, ids, on_input = p
    perm = list(range(x.shape[0]))
    rnd.shuffle(perm)
    perm_t = torch.tensor(perm)
    out = reference_moe(x, w1, w2, w, ids, apply_router_weight_on_input=on_input).output
    out_p = reference_moe(x[perm_t], w1, w2, w[perm_t], ids[perm_t], apply_router_weight_on_input=on_input).output
    close(out_p, out[perm_t])


@given(problems(), st.randoms(use_true_random=False))
def test_relabelling_experts_with_their_weights_changes_nothing(p, rnd):
    x, w1, w2, w, ids, on_input = p
    e = w1.shape[0]
    perm = list(range(e))
    rnd.shuffle(perm)
    new_of_old = torch.tensor(perm)  # expert i becomes expert perm[i]
    w1n, w2n = torch.empty_like(w1), torch.empty_like(w2)
    w1n[new_of_old], w2n[new_of_old] = w1, w2
    ids_n = new_of_old[ids.long()].to(torch.int32)
    a = reference_moe(x, w1, w2, w, ids, apply_router_weight_on_input=on_input).output
    b = reference_moe(x, w1n, w2n, w, ids_n, apply_router_weight_on_input=on_input).output
    close(a, b)


@given(problems(), st.data())
def test_zero_router_weight_removes_that_expert(p, data):
    """Weight 0 on (t, j) equals routing (t, j) to an appended all-zero expert: no contribution."""
    x, w1, w2, w, ids, on_input = p
    t = data.draw(st.integers(0, x.shape[0] - 1))
    j = data.draw(st.integers(0, ids.shape[1] - 1))
    w0 = w.clone()
    w0[t, j] = 0.0
    zero_w1 = torch.cat([w1, torch.zeros_like(w1[:1])])
    zero_w2 = torch.cat([w2, torch.zeros_like(w2[:1])])
    ids_z = ids.clone()
    ids_z[t, j] = w1.shape[0]
    a = reference_moe(x, w1, w2, w0, ids, apply_router_weight_on_input=on_input)
    b = reference_moe(x, zero_w1, zero_w2, w, ids_z, apply_router_weight_on_input=on_input)
    close(a.output, b.output)
    # and the removed pair changes the output unless its expert's output is zero there
    full = reference_moe(x, w1, w2, w, ids, apply_router_weight_on_input=on_input).output
    assert not torch.equal(full[t], a.output[t]) or float(full[t].abs().max()) == 0.0


def test_router_weight_on_input_is_not_the_same_as_on_output():
    """silu is not linear: scaling before the MLP differs from scaling after (the flag matters)."""
    g = torch.Generator().manual_seed(3)
    x, w1, w2 = torch.randn(3, 8, generator=g), torch.randn(4, 8, 8, generator=g), torch.randn(4, 8, 4, generator=g)
    ids = torch.tensor([[0], [1], [2]], dtype=torch.int32)
    w = torch.tensor([[0.3], [0.5], [0.9]])
    a = reference_moe(x, w1, w2, w, ids, apply_router_weight_on_input=True).output
    b = reference_moe(x, w1, w2, w, ids, apply_router_weight_on_input=False).output
    assert (a - b).abs().max() > 1e-3


def test_unpack_int4_low_nibble_first():
    packed = torch.tensor([[0x21, 0xF0]], dtype=torch.uint8)
    assert unpack_int4(packed).tolist() == [[1, 2, 0, 15]]


def test_dequantize_grouped_and_per_channel():
    q8 = torch.tensor([[[130, 126, 128, 0]]], dtype=torch.uint8)  # [E=1, N=1, K=4]
    s = torch.tensor([[[0.5, 2.0]]])  # groups of 2 along K
    assert dequantize(q8, s, Quant("int8_w8a16", 2)).tolist() == [[[1.0, -1.0, 0.0, -256.0]]]
    q4 = torch.tensor([[[0x9A]]], dtype=torch.uint8)  # values 10, 9 -> 2, 1
    assert dequantize(q4, torch.tensor([[[3.0]]]), Quant("int4_w4a16", 2)).tolist() == [[[6.0, 3.0]]]
    s8 = torch.tensor([[[0.25], [4.0]]])  # per output row
    signed = torch.tensor([[[-4, 8], [1, -2]]], dtype=torch.int8)
    assert dequantize(signed, s8, Quant("int8_w8a16", 0)).tolist() == [[[-1.0, 2.0], [4.0, -8.0]]]
    with pytest.raises(ValueError, match="int8_w8a16 only"):
        dequantize(torch.zeros(1, 1, 1, dtype=torch.uint8), torch.ones(1, 1, 1), Quant("int4_w4a16", 0))


def test_quantized_reference_equals_reference_on_dequantized_weights():
    g = torch.Generator().manual_seed(5)
    e, n, k, gs = 3, 8, 16, 8
    w1 = torch.randint(0, 256, (e, 2 * n, k // 2), generator=g, dtype=torch.uint8)
    w2 = torch.randint(0, 256, (e, k, n // 2), generator=g, dtype=torch.uint8)
    s1, s2 = torch.rand(e, 2 * n, k // gs, generator=g), torch.rand(e, k, n // gs, generator=g)
    q = Quant("int4_w4a16", gs)
    x = torch.randn(2, k, generator=g)
    ids = torch.tensor([[0, 2], [1, 2]], dtype=torch.int32)
    w = torch.tensor([[0.5, 0.5], [0.25, 0.75]])
    a = reference_moe(x, w1, w2, w, ids, quant=q, w1_scale=s1, w2_scale=s2).output
    b = dense_moe(x, dequantize(w1, s1, q), dequantize(w2, s2, q), w, ids)
    close(a, b)


def test_tolerance_scales_with_dtype_and_magnitude():
    mag = torch.tensor([[1.0, 3.0]])
    ref = Reference(torch.zeros(1, 2), mag)
    rms = math.sqrt(5.0)
    assert tolerance(ref, torch.bfloat16).tolist()[0] == pytest.approx([8 * 2**-8 * (1 + rms), 8 * 2**-8 * (3 + rms)])
    assert tolerance(ref, torch.float32)[0, 0] == pytest.approx(16 * 2**-11 * (1 + rms))
    assert tolerance(ref, torch.bfloat16, Quant("int8_w8a16", 0))[0, 0] == pytest.approx(24 * 2**-8 * (1 + rms))
    assert tolerance(ref, torch.float16)[0, 0] < tolerance(ref, torch.bfloat16)[0, 0]
    doubled = Reference(torch.zeros(1, 2), 2 * mag)
    assert torch.allclose(tolerance(doubled, torch.bfloat16), 2 * tolerance(ref, torch.bfloat16))
    # rms is per token: an all-zero row (no local expert) does not shrink another row's bound
    two_rows = Reference(torch.zeros(2, 2), torch.tensor([[1.0, 3.0], [0.0, 0.0]]))
    assert torch.allclose(tolerance(two_rows, torch.bfloat16)[0], tolerance(ref, torch.bfloat16)[0])
    assert tolerance(two_rows, torch.bfloat16)[1].abs().sum() == 0


def test_compare_passes_rounding_and_fails_a_dropped_expert():
    """bf16 rounding of the true output passes; dropping one routed expert fails."""
    g = torch.Generator().manual_seed(11)
    e, m, k, hid, inter = 16, 6, 8, 256, 128
    x = torch.randn(m, hid, generator=g).bfloat16().float()
    w1 = (torch.randn(e, 2 * inter, hid, generator=g) / math.sqrt(hid)).bfloat16().float()
    w2 = (torch.randn(e, hid, inter, generator=g) / math.sqrt(inter)).bfloat16().float()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]).to(torch.int32)
    w = torch.rand(m, k, generator=g) + 0.05
    w = w / w.sum(-1, keepdim=True)
    ref = reference_moe(x, w1, w2, w, ids)
    assert compare(ref.output.bfloat16(), ref, torch.bfloat16).ok
    w_drop = w.clone()
    w_drop[0, 0] = 0
    dropped = reference_moe(x, w1, w2, w_drop, ids).output.bfloat16()
    result = compare(dropped, ref, torch.bfloat16)
    assert not result.ok, result
    nan_out = ref.output.clone()
    nan_out[0, 0] = float("nan")
    assert not compare(nan_out, ref, torch.float32).ok


def test_a_failing_comparison_names_the_reference_the_kernel_and_the_tolerance_at_its_worst_element():
    """What the failure page quotes: the element furthest outside its bound, with both values and the bound there."""
    ref = Reference(torch.tensor([[0.5, -1.0], [2.0, 0.25]]), torch.tensor([[1.0, 1.0], [2.0, 0.5]]))
    out = ref.output.clone()
    out[1, 1] = 0.75  # 0.5 off, where the bound is smallest: the worst ratio
    out[1, 0] = 2.6  # further off in absolute terms, under a larger bound
    tol = tolerance(ref, torch.bfloat16)
    result = compare(out, ref, torch.bfloat16)
    assert not result.ok and result.worst == pytest.approx((0.25, 0.75, tol[1, 1].item()))
    assert result.worst_ratio == pytest.approx(0.5 / tol[1, 1].item())
    assert (
        str(result).splitlines()[1] == f"  at the worst element: reference 0.25, kernel 0.75, tolerance {tol[1, 1]:.3g}"
    )


# --- fused shared-expert rows ---------------------------------------------------------


def shared_mlp(x, w1s, w2s):
    """A shared expert as the unfused model runs it: a dense gated MLP over every token, added in full."""
    n = w1s.shape[0] // 2
    h = x.float() @ w1s.float().T
    return (F.silu(h[:, :n]) * h[:, n:]) @ w2s.float().T


@st.composite
def shared_problems(draw):
    """A routed problem plus 1-2 fused shared rows laid out as vLLM fuses them (rows and ids after the routed)."""
    x, w1, w2, w, ids, _ = draw(problems(on_input=False))
    s = draw(st.integers(1, 2))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    e, hid, inter = w1.shape[0], w1.shape[2], w2.shape[2]
    w1s = torch.randn(s, 2 * inter, hid, generator=g) / math.sqrt(hid)
    w2s = torch.randn(s, hid, inter, generator=g) / math.sqrt(inter)
    m = x.shape[0]
    fused_ids = torch.cat([ids, torch.arange(e, e + s, dtype=torch.int32).expand(m, s)], dim=1)
    fused_w = torch.cat([w, torch.full((m, s), SHARED_EXPERT_WEIGHT)], dim=1)
    return x, w1, w2, w, ids, w1s, w2s, fused_ids, fused_w


@given(shared_problems())
def test_fused_shared_rows_equal_the_separate_shared_mlp(p):
    """Fusing is exact: routed MoE plus each shared expert's dense MLP, the unfused model's output."""
    x, w1, w2, w, ids, w1s, w2s, fused_ids, fused_w = p
    fused = reference_moe(x, torch.cat([w1, w1s]), torch.cat([w2, w2s]), fused_w, fused_ids).output
    separate = dense_moe(x, w1, w2, w, ids) + sum(shared_mlp(x, a, b) for a, b in zip(w1s, w2s))
    close(fused, separate)
    # and the dense formulation over all rows agrees (the shared rows are experts like any other)
    close(fused, dense_moe(x, torch.cat([w1, w1s]), torch.cat([w2, w2s]), fused_w, fused_ids))


@given(shared_problems(), st.data())
def test_expert_map_keeps_shared_rows_local_on_every_rank(p, data):
    """Rank r: its routed experts (others remote) plus every shared expert in full, for every token."""
    x, w1, w2, w, ids, w1s, w2s, fused_ids, fused_w = p
    e, s = w1.shape[0], w1s.shape[0]
    size = data.draw(st.integers(1, e))
    shared_mlp_sum = sum(shared_mlp(x, a, b) for a, b in zip(w1s, w2s))
    routed_total = torch.zeros_like(shared_mlp_sum)
    for rank in range(size):
        em = ExpertMap(size, rank)
        start, end = em.local_range(e)
        emap = torch.tensor(em.as_list(e, s), dtype=torch.int32)
        local_w1, local_w2 = torch.cat([w1[start:end], w1s]), torch.cat([w2[start:end], w2s])
        part = reference_moe(x, local_w1, local_w2, fused_w, fused_ids, expert_map=emap).output
        mask = torch.zeros(e)
        mask[start:end] = 1
        routed = dense_moe(x, w1 * mask[:, None, None], w2 * mask[:, None, None], w, ids)
        close(part, routed + shared_mlp_sum)
        routed_total += routed
    close(routed_total, dense_moe(x, w1, w2, w, ids))


def test_ids_that_reach_no_row_are_refused_with_the_reason():
    g = torch.Generator().manual_seed(2)
    x, w1, w2 = torch.randn(2, 8, generator=g), torch.randn(4, 8, 8, generator=g), torch.randn(4, 8, 4, generator=g)
    w = torch.full((2, 2), 0.5)
    shared_id_without_row = torch.tensor([[0, 4], [1, 4]], dtype=torch.int32)  # id 4: a shared slot, 4 rows only
    with pytest.raises(ValueError, match=r"span \[0, 4\] but index w1's 4 rows"):
        reference_moe(x, w1, w2, w, shared_id_without_row)
    routed_only_map = torch.tensor(ExpertMap(2, 0).as_list(4), dtype=torch.int32)  # no entry for a shared id 4
    with pytest.raises(ValueError, match="expert map's 4 entries"):
        reference_moe(x, w1[:2], w2[:2], w, shared_id_without_row, expert_map=routed_only_map)
    too_few_rows = torch.tensor(ExpertMap(2, 0).as_list(4, 1), dtype=torch.int32)  # shared id -> local row 2
    with pytest.raises(ValueError, match="local rows up to 2, but w1 has 2 rows"):
        reference_moe(x, w1[:2], w2[:2], w, shared_id_without_row, expert_map=too_few_rows)
