"""The corpus's ``wna16-block-k-divisor`` (vLLM #30210) against the kernel tier's K 2880 int4 draw, on a CPU.

vLLM's block heuristic for its CUDA wNa16 kernel is plain Python: the real vLLM 0.33.0 is asked, in its own
interpreter, for the BLOCK_SIZE_K of every call ``wna16_off_grid_cases`` can make (both GEMMs, every token count and
top-k), once as installed and once with the corpus's re-plant of ``get_moe_wna16_block_config`` (the re-planted
function's source, run among the installed module's names). Installed, every block divides K in a ratio the kernel
takes; re-planted, no GEMM's does (128 for both), so the kernel refuses every call of the draw
(``tests/kernels/test_kernel_wna16_shared.py`` runs it on a GPU). vLLM's own rule
(``should_moe_wna16_use_cuda``, asked as on a CUDA platform) sends every such call to that kernel.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from moegate.kernels.wna16_blocks import ACCEPTED_RATIOS
from moegate.power.corpus import load, replant, scope_span, select
from moegate.strategies.kernels import (
    MAX_KERNEL_TOKENS,
    WNA16_CUDA_TOKENS_PER_EXPERT,
    WNA16_OFF_GRID_GROUP,
    WNA16_OFF_GRID_SHAPE,
)

VLLM_033 = Path.home() / ".cache/moegate/envs/_vllm-0.33.0/bin/python"
FUSED_MOE = "model_executor/layers/fused_moe/fused_moe.py"
SCOPE = "get_moe_wna16_block_config"
TOP_KS = (1, 2, 3, 4, 6, 8)  # what wna16_off_grid_cases draws from

# run by vLLM 0.33.0's interpreter: stdin {"planted": source of the re-planted function, "calls": [...]};
# prints, per call, the installed and the re-planted BLOCK_SIZE_K and whether vLLM takes its CUDA kernel
ASK = """
import importlib, json, sys, types
fm = importlib.import_module("vllm.model_executor.layers.fused_moe.fused_moe")
job = json.load(sys.stdin)
names = dict(vars(fm))
exec(job["planted"], names)
planted = names[job["scope"]]
cuda = types.SimpleNamespace(is_cuda=lambda: True)
use_cuda = types.FunctionType(fm.should_moe_wna16_use_cuda.__code__, {**vars(fm), "current_platform": cuda})
out = []
for c in job["calls"]:
    args = dict(config={"BLOCK_SIZE_M": 16}, use_moe_wna16_cuda=True, num_valid_tokens=c["pairs"], size_k=c["k"],
                size_n=c["n"], num_experts=c["n"], group_size=c["group"], real_top_k=c["top_k"], block_size_m=16)
    out.append({"clean": fm.get_moe_wna16_block_config(**args)["BLOCK_SIZE_K"],
                "planted": planted(**args)["BLOCK_SIZE_K"],
                "cuda": use_cuda(c["pairs"], c["group"], c["experts"], 4)})
print(json.dumps(out))
"""


def _calls() -> list[dict[str, int | str]]:
    """Both GEMMs of every (tokens, top-k) the draw makes (the second GEMM's rows are the pairs, top-1)."""
    experts, hidden, inter = WNA16_OFF_GRID_SHAPE
    calls: list[dict[str, int | str]] = []
    for tokens in range(1, MAX_KERNEL_TOKENS + 1):
        for top_k in TOP_KS:
            pairs = tokens * top_k
            if pairs > WNA16_CUDA_TOKENS_PER_EXPERT * experts:
                continue
            common = {"pairs": pairs, "group": WNA16_OFF_GRID_GROUP, "experts": experts}
            calls.append({"gemm": "w13", "k": hidden, "n": 2 * inter, "top_k": top_k, **common})
            calls.append({"gemm": "w2", "k": inter, "n": hidden, "top_k": 1, **common})
    return calls


@pytest.mark.skipif(not VLLM_033.is_file(), reason=f"needs the real vLLM 0.33.0 environment at {VLLM_033}")
def test_the_replant_picks_a_block_k_that_does_not_divide_k_for_the_kernel_tiers_draw_and_vllm_does_not() -> None:
    site = next(VLLM_033.parent.parent.glob("lib/python3*/site-packages/vllm"))
    (bug,) = select(load(), ["wna16-block-k-divisor"])
    text = replant(bug, site)[FUSED_MOE]
    start, end = scope_span(text, SCOPE)
    calls = _calls()
    job = json.dumps({"planted": text[start:end], "scope": SCOPE, "calls": calls})
    proc = subprocess.run(
        [str(VLLM_033), "-c", ASK], input=job, capture_output=True, text=True, check=False, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(got) == len(calls) > 0
    assert all(g["cuda"] for g in got), "a call of the draw would not reach vLLM's CUDA wNa16 kernel"
    for c, g in zip(calls, got):
        assert c["k"] % g["clean"] == 0 and g["clean"] // WNA16_OFF_GRID_GROUP in ACCEPTED_RATIOS, (c, g)
    refused = [(c, g) for c, g in zip(calls, got) if c["k"] % g["planted"]]
    assert refused, "the re-plant picks a block dividing K for every call: the draw cannot tell it from the fix"
    assert {(c["gemm"], g["planted"]) for c, g in refused} == {("w13", 128), ("w2", 128)}, refused[:3]
    assert all(c["k"] % 128 for c in calls)  # the draw's K: neither GEMM's a multiple of 128
