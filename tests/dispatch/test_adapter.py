"""The adapter's own contract against the installed vLLM: modes, and vLLM left as it was found."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moegate.core.case import ENTRYPOINTS, ExpertMap, MoECase
from moegate.dispatch.names import TargetError
from moegate.dispatch.recorders import RECORDERS
from moegate.dispatch.target import VllmTarget


def test_targets_share_recorders_and_the_last_close_restores_vllm(target):
    fm = target.fm
    patched = fm.moe_align_block_size
    users = RECORDERS.users
    extra = VllmTarget(finish=False)
    assert fm.moe_align_block_size is patched and RECORDERS.users == users + 1
    extra.close()
    extra.close()  # idempotent
    assert RECORDERS.users == users and fm.moe_align_block_size is patched


def test_decision_only_calls_stop_at_the_first_launch(target):
    obs = target.run(MoECase(num_tokens=2, top_k=2, num_experts=64), "legacy")
    assert not obs.completed and obs.output is None and len(obs.launches) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU running to the end is allowed")
def test_running_to_the_end_on_a_cpu_is_refused_with_the_reason():
    with pytest.raises(TargetError, match="needs a CUDA GPU"):
        VllmTarget(finish=True)


def test_a_stopped_call_leaves_no_kernel_config_override_behind(target):
    """A decision-only call fixes vLLM's kernel config while it runs, and must restore it."""
    sentinel = {"BLOCK_SIZE_M": 64, "moegate": "sentinel"}
    with target.pkg.override_config(sentinel):
        for ep in ("legacy", "modular"):
            obs = target.run(MoECase(num_tokens=1, top_k=1, num_experts=8), ep)
            assert not obs.completed
            assert target.pkg.get_config() is sentinel, f"{ep}: the call left {target.pkg.get_config()} behind"


def test_uva_is_reported_only_where_a_gpu_can_read_host_memory(target):
    """The kernel tier skips with a reason where UVA is missing; on a CPU it is missing by definition."""
    if torch.cuda.is_available():
        assert isinstance(target.uva_available(), bool)
    else:
        assert target.uva_available() is False


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
def test_fused_shared_rows_reach_the_kernel_as_rows_and_ids(target, entrypoint):
    """A shared expert is one more row of w1 and one more id per token (the last), and the call accepts it."""
    case = MoECase(num_tokens=2, top_k=1, num_experts=15, shared_experts=1)  # 2*(1+1)*4 = 16 <= 15+1: naive
    obs = target.run(case, entrypoint)
    assert obs.path == "naive"
    (launch,) = obs.launches
    assert (launch.experts, launch.top_k) == (16, 2)
    ((ids, _, _),) = obs.naive_assignments
    assert ids[1::2] == [15, 15], "every token's second id is the shared row"

    ep = dataclasses.replace(case, expert_map=ExpertMap(2, 1))  # rank 1 holds routed 8-14 and the shared row
    obs = target.run(ep, entrypoint)
    assert obs.path == "sorted" and obs.align_num_experts == [16]
    assert obs.launches[0].experts == 7 + 1
