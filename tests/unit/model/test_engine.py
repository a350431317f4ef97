"""The engine scenarios ask vLLM's loader for the placement the lifecycle test expects; bad input is one line.

No vLLM here: these check the arguments ``moegate.model.engine`` passes, against the
offloader's documented behaviour (budget in GiB turned into bytes, a per-parameter
cut-off once the budget is reached, whole-segment name matching), and the
command line's refusals, which come before vLLM is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from moegate.model.engine import SCENARIOS, engine_kwargs, prompts
from moegate.model.tiny_spec import TinyMoESpec
from tests.support import ROOT

SPEC = TinyMoESpec()
# expert weight names relative to a decoder layer, as vLLM 0.32.0's engine registers them (observed on
# the CPU build) and vLLM 0.33.0's source does: the runner holds a RoutedExperts submodule
LAYER_NAMES = ("mlp.experts.routed_experts.w13_weight", "mlp.experts.routed_experts.w2_weight")


def segment_match(selectors: set[str], name: str) -> bool:
    """vLLM's documented rule for cpu_offload_params: a selector matches whole dot-separated segments."""
    return any(f".{s}." in f".{name}." for s in selectors)


def budget_bytes(kw: dict) -> int:
    return int(kw["cpu_offload_gb"] * 1024**3)  # how vLLM turns the GiB budget into bytes


def test_device_scenario_offloads_nothing():
    kw = engine_kwargs(SCENARIOS["device"], SPEC, cuda=True, moe_backend=None)
    assert not {"offload_backend", "cpu_offload_gb", "cpu_offload_params"} & set(kw)
    assert kw["moe_backend"] == "triton" and kw["enforce_eager"] and not kw["enable_prefix_caching"]


def test_budget_w13_is_exactly_one_layers_w13():
    kw = engine_kwargs(SCENARIOS["budget-w13"], SPEC, cuda=True, moe_backend=None)
    assert kw["offload_backend"] == "uva" and kw["cpu_offload_params"] == {"experts"}
    # offloading stops once the offloaded bytes reach the budget: after the first matched parameter
    assert budget_bytes(kw) == SPEC.w13_bytes == 16 * 2**20
    for shape in (TinyMoESpec(experts=60, hidden=192, moe_intermediate=96), TinyMoESpec(experts=7, top_k=2)):
        assert (
            budget_bytes(engine_kwargs(SCENARIOS["budget-w13"], shape, cuda=True, moe_backend=None)) == shape.w13_bytes
        )


def test_uva_all_budget_covers_every_expert_weight():
    kw = engine_kwargs(SCENARIOS["uva-all"], SPEC, cuda=True, moe_backend=None)
    assert budget_bytes(kw) >= SPEC.expert_bytes
    assert all(segment_match(kw["cpu_offload_params"], n) for n in LAYER_NAMES)


def test_select_w2_selects_w2_only_in_the_nested_layout():
    kw = engine_kwargs(SCENARIOS["select-w2"], SPEC, cuda=True, moe_backend=None)
    w13, w2 = LAYER_NAMES
    assert segment_match(kw["cpu_offload_params"], w2) and not segment_match(kw["cpu_offload_params"], w13)
    assert segment_match(kw["cpu_offload_params"], "mlp.experts.w2_weight")  # a flat layout too
    # the selector vLLM's docs give matches nothing in the nested layout: it alone would offload nothing
    assert not segment_match({"experts.w2_weight"}, w2)
    assert budget_bytes(kw) >= SPEC.layers * SPEC.w2_bytes


def test_cpu_runs_leave_gpu_only_arguments_out():
    kw = engine_kwargs(SCENARIOS["device"], SPEC, cuda=False, moe_backend=None)
    assert not {"gpu_memory_utilization", "kv_cache_memory_bytes", "moe_backend"} & set(kw)


def test_gpu_engines_have_a_fixed_kv_cache_so_vllm_skips_memory_profiling():
    # profiling stops an engine when other work on the GPU frees memory meanwhile (the H200 rehearsal, 2026-12-02)
    for name in SCENARIOS:
        kw = engine_kwargs(SCENARIOS[name], SPEC, cuda=True, moe_backend=None)
        assert kw["kv_cache_memory_bytes"] == 256 << 20


def test_prompts_are_fixed_and_in_vocabulary():
    assert prompts(512) == prompts(512)
    assert [len(p) for p in prompts(512)] == [4, 5, 9, 16]
    assert all(2 <= t < 512 for p in prompts(512) for t in p)
    # the 4-token prefill and the 4-prompt decode step sit on the naive boundary of the default model
    assert 4 * SPEC.top_k * 4 == SPEC.experts


def _engine(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "moegate.model.engine", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A config.json alone: enough for the checks that come before the engine starts."""
    cfg = {
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 512,
        "max_position_embeddings": 512,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scenario", "nope"], "moegate.model.engine: unknown scenario 'nope'; expected one of"),
        (["--scenario", "device", "--max-tokens", "0"], "moegate.model.engine: --max-tokens must be >= 1, got 0"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(model_dir, tmp_path, args, message):
    proc = _engine("--model", str(model_dir), "--json", str(tmp_path / "o.json"), *args)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(message)
    assert not (tmp_path / "o.json").exists()


def test_a_directory_that_is_no_model_gets_one_line(tmp_path):
    proc = _engine("--model", str(tmp_path / "none"), "--scenario", "device", "--json", str(tmp_path / "o.json"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"moegate.model.engine: --model {tmp_path / 'none'}: {tmp_path / 'none'} is not a model directory (no config.json)"
    ]


def test_tracing_without_cuda_is_refused_with_the_way_out(model_dir, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tracing is allowed here")
    proc = _engine("--model", str(model_dir), "--scenario", "device", "--json", str(tmp_path / "o.json"))
    assert proc.returncode == 2
    # torch may warn on import (e.g. without numpy); moegate's own report is the one line
    assert [line for line in proc.stderr.splitlines() if line.startswith("moegate")] == [
        "moegate.model.engine: tracing fused-MoE calls needs a CUDA GPU; pass --no-trace for a CPU smoke run"
    ]
