"""The traffic model on CPU: each path's row blocks and the bytes they read."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moegate.core.case import ExpertMap, MoECase, Placement, Quant
from moegate.kernels.traffic import ExpertBytes, naive_blocks, reads_per_expert, sorted_blocks, step_bytes, step_traffic

QWEN = MoECase(num_tokens=1, top_k=8, num_experts=128, hidden=2048, intermediate=768, dtype="bfloat16")


@st.composite
def routings(draw):
    e = draw(st.integers(1, 64))
    k = draw(st.integers(1, min(8, e)))
    m = draw(st.integers(1, 16))
    rows = [draw(st.permutations(range(e)))[:k] for _ in range(m)]
    return e, rows


@given(routings(), st.integers(16, 64))
def test_sorted_reads_each_routed_expert_once_per_step(r, block_m):
    _, rows = r
    reads = reads_per_expert(sorted_blocks(rows, block_m))
    assert set(reads) == {x for row in rows for x in row}
    assert all(v == 1 for v in reads.values())  # at most 16 tokens <= block_m pairs per expert


@given(routings())
def test_naive_reads_once_per_pair(r):
    _, rows = r
    reads = reads_per_expert(naive_blocks(rows))
    for expert, count in reads.items():
        assert count == sum(row.count(expert) for row in rows)
    assert sum(reads.values()) == len(rows) * len(rows[0])


@given(routings(), st.integers(1, 8))
def test_sorted_blocks_pad_each_expert_to_block_m(r, block_m):
    _, rows = r
    reads = reads_per_expert(sorted_blocks(rows, block_m))
    for expert, n in reads.items():
        pairs = sum(row.count(expert) for row in rows)
        assert n == -(-pairs // block_m)


@given(routings(), st.data())
def test_remote_experts_read_nothing(r, data):
    e, rows = r
    size = data.draw(st.integers(1, e))
    rank = data.draw(st.integers(0, size - 1))
    emap = ExpertMap(size, rank).as_list(e)
    per = ExpertBytes(10, 5)
    local = sum(1 for row in rows for x in row if emap[x] >= 0)
    assert step_bytes(naive_blocks(rows, emap), per) == 15 * local


def test_qwen_bytes_and_ratio():
    per = ExpertBytes.of_case(QWEN)
    assert (per.w13, per.w2) == (2 * 1536 * 2048, 2 * 2048 * 768)
    # two tokens sharing 4 of their 8 experts: naive reads 16 experts, sorted 12
    rows = [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 8, 9, 10, 11]]
    tr = step_traffic(rows, per, block_m=16)
    assert tr.naive == 16 * per.read() and tr.sorted == 12 * per.read()
    assert tr.ratio == pytest.approx(16 / 12)
    w13_only = step_traffic(rows, per, 16, placement=Placement(True, False))
    assert w13_only.sorted == 12 * per.w13


def test_quantized_expert_bytes():
    int4 = MoECase(num_tokens=1, top_k=1, num_experts=4, hidden=256, intermediate=128, quant=Quant("int4_w4a16", 64))
    assert ExpertBytes.of_case(int4) == ExpertBytes(w13=256 * 128, w2=256 * 64)


def test_bad_block_m():
    with pytest.raises(ValueError):
        sorted_blocks([[0]], 0)
