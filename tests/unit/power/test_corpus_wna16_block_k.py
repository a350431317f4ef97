"""The corpus's ``wna16-block-k-divisor`` (vLLM #30210) against ``wna16_off_grid_cases``, in the real vLLM 0.33.0 on
a CPU: its BLOCK_SIZE_K for each call the draw makes, installed and with the re-planted function (run among the
installed module's names), and whether vLLM's rule (asked as on CUDA) takes its CUDA wNa16 kernel."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from moegate.kernels.wna16_blocks import ACCEPTED_RATIOS, MAX_VALID_TOKENS_PER_EXPERT
from moegate.power.corpus import load, replant, scope_span, select
from moegate.strategies import kernels as sk

VLLM_033 = Path.home() / ".cache/moegate/envs/_vllm-0.33.0/bin/python"
SCOPE = "get_moe_wna16_block_config"
ASK = """
import importlib, json, sys, types
fm = importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")
job, names = json.load(sys.stdin), dict(vars(fm))
exec(job["planted"], names)
cuda = types.FunctionType(fm.should_moe_wna16_use_cuda.__code__,
                          {**vars(fm), "current_platform": types.SimpleNamespace(is_cuda=lambda: True)})
out = []
for c in job["calls"]:
    a = dict(config={"BLOCK_SIZE_M": 16}, use_moe_wna16_cuda=True, num_valid_tokens=c["pairs"], size_k=c["k"],
             size_n=c["n"], num_experts=c["n"], group_size=c["g"], real_top_k=c["top_k"], block_size_m=16)
    out.append([fm.get_moe_wna16_block_config(**a)["BLOCK_SIZE_K"], names[job["scope"]](**a)["BLOCK_SIZE_K"],
                cuda(c["pairs"], c["g"], c["e"], 4)])
print(json.dumps(out))
"""


@pytest.mark.skipif(not VLLM_033.is_file(), reason=f"needs the real vLLM 0.33.0 environment at {VLLM_033}")
def test_the_replant_picks_a_block_k_that_does_not_divide_k_for_the_kernel_tiers_draw_and_vllm_does_not() -> None:
    e, hidden, inter = sk.WNA16_OFF_GRID_SHAPE
    G = sk.WNA16_OFF_GRID_GROUP
    calls = [
        {"gemm": gemm, "k": k, "n": n, "top_k": top_k, "pairs": t * tk, "g": G, "e": e}
        for t in range(1, sk.MAX_KERNEL_TOKENS + 1)
        for tk in (1, 2, 3, 4, 6, 8)
        if t * tk <= sk.WNA16_CUDA_TOKENS_PER_EXPERT * e
        for gemm, k, n, top_k in (("w13", hidden, 2 * inter, tk), ("w2", inter, hidden, 1))
    ]
    site = next(VLLM_033.parent.parent.glob("lib/python3*/site-packages/vllm"))
    text = replant(select(load(), ["wna16-block-k-divisor"])[0], site)["model_executor/layers/fused_moe/fused_moe.py"]
    start, end = scope_span(text, SCOPE)
    job = json.dumps({"planted": text[start:end], "scope": SCOPE, "calls": calls})
    proc = subprocess.run(
        [str(VLLM_033), "-c", ASK], input=job, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got) == len(calls) > 0 and all(cuda for _, _, cuda in got)  # every call: the CUDA kernel
    assert all(c["k"] % clean == 0 and clean // G in ACCEPTED_RATIOS for c, (clean, _, _) in zip(calls, got))
    assert {(c["gemm"], planted) for c, (_, planted, _) in zip(calls, got) if c["k"] % planted} == {
        ("w13", 128),
        ("w2", 128),
    }


def test_the_strategies_wna16_token_bound_is_the_kernel_choices_own() -> None:
    """The strategies' copy of the bound (they sit below ``moegate.kernels`` and cannot import it) stays vLLM's."""
    assert sk.WNA16_CUDA_TOKENS_PER_EXPERT == MAX_VALID_TOKENS_PER_EXPERT
