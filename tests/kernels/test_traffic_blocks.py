"""The traffic model's sorted block assignment equals what vLLM's ``moe_align_block_size`` produces."""

from __future__ import annotations

from collections import Counter

import torch
from hypothesis import given
from hypothesis import strategies as st

from moegate.core.case import ExpertMap
from moegate.kernels.traffic import sorted_blocks


@given(  # one alignment call an example, as cheap as a dispatch example: the profile's own count
    e=st.sampled_from([8, 16, 64, 128]),
    m=st.integers(1, 40),
    block_m=st.sampled_from([16, 32, 64]),
    ep=st.sampled_from([1, 2, 4]),
    data=st.data(),
)
def test_align_blocks_match_traffic_model(cuda_target, e, m, block_m, ep, data):
    k = data.draw(st.integers(1, min(8, e)))
    seed = data.draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    rows = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(m)]).to(torch.int32)
    emap_list = ExpertMap(ep, data.draw(st.integers(0, ep - 1))).as_list(e) if ep > 1 else None
    emap = None if emap_list is None else torch.tensor(emap_list, dtype=torch.int32, device="cuda")
    got = cuda_target.align_blocks(rows.cuda(), block_m, e, emap)
    assert Counter(got) == Counter(sorted_blocks(rows, block_m, emap_list))
