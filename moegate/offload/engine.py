"""One vLLM engine start on a tiny checkpoint (bf16 or pre-quantized) with its experts UVA-offloaded, judged for offload truth.

    python -m moegate.offload.engine --model DIR --json OUT [--budget-gb G] [--segments experts]
        [--moe-backend triton] [--max-tokens N]

The engine loads the checkpoint with ``offload_backend="uva", cpu_offload_gb=G,
cpu_offload_params={SEGMENTS}`` (``--budget-gb 0``: no offload, the control), generates a few
greedy tokens (the engine serves with the weights where they are), then inside its worker
``moegate.offload.residency.observe`` asks the CUDA driver where every parameter lives and
``calibrate_pinned`` measures the pinned allocator's rounding. ``moegate.offload.verdict.judge``
gives the verdict; the JSON holds it with the observation it rests on. The exit code says whether
the run completed (0), not the verdict: the plan (``moegate.offload.plan``) compares verdicts
with expectations. Needs CUDA. Imports no vLLM itself: the engine comes through ``moegate.dispatch.offline``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from moegate.core.golden_files import atomic_write
from moegate.dispatch import offline
from moegate.model.tiny_spec import TinyMoESpec
from moegate.offload import residency
from moegate.offload.verdict import Budget, judge, to_json

ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1"}
GPU_MEMORY_UTILIZATION = 0.05
PROMPTS = ([5, 17, 42, 99], [7, 8, 9])


class OffloadInputError(ValueError):
    """Bad command-line input; one line."""


def engine_kwargs(spec: TinyMoESpec, budget_gb: float, segments: list[str], moe_backend: str) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "dtype": "bfloat16",
        "seed": 0,
        "enforce_eager": True,
        "max_model_len": min(256, spec.max_positions),
        "skip_tokenizer_init": True,
        "enable_prefix_caching": False,
        "async_scheduling": False,
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "kv_cache_memory_bytes": offline.FIXED_KV_CACHE_BYTES,
        "moe_backend": moe_backend,
    }
    if budget_gb > 0:
        kw.update({"offload_backend": "uva", "cpu_offload_gb": budget_gb, "cpu_offload_params": set(segments)})
    return kw


def run(model: Path, budget_gb: float, segments: list[str], moe_backend: str, max_tokens: int) -> dict[str, Any]:
    import torch  # the GPU's own library: the engine runs only where it is

    if not torch.cuda.is_available():
        raise OffloadInputError("offload truth needs a CUDA GPU: host memory mapped for the GPU exists only there")
    os.environ.update(ENGINE_ENV)
    spec = TinyMoESpec.from_model_dir(model)
    kwargs = engine_kwargs(spec, budget_gb, segments, moe_backend)
    missing = sorted(set(kwargs) - offline.engine_arg_names())
    if missing:
        raise OffloadInputError(f"vLLM {offline.version()}'s EngineArgs lacks {missing}")
    timings = {}
    t0 = time.perf_counter()
    llm = offline.offline_engine(str(model), **kwargs)
    timings["engine_init_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    outs = llm.generate(
        [{"prompt_token_ids": list(p)} for p in PROMPTS], offline.greedy_sampling(max_tokens), use_tqdm=False
    )
    timings["generate_s"] = time.perf_counter() - t0
    # after serving: where the weights are while the engine uses them; the calibration after that
    selection = segments if budget_gb > 0 else []
    observation = llm.apply_model(functools.partial(residency.observe, segments=selection))[0]
    calibration = llm.apply_model(residency.calibrate_pinned)[0]
    budget = Budget.from_gb(budget_gb, selection) if budget_gb > 0 else Budget(0, tuple(selection))
    verdict = judge(observation, budget, calibration)
    return {
        "model": str(model),
        "quantization": (json.loads((model / "config.json").read_text()).get("quantization_config") or {}).get(
            "quant_method"
        ),
        "vllm": offline.version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "engine_kwargs": {k: sorted(v) if isinstance(v, set) else v for k, v in kwargs.items()},
        "observation": observation,
        "calibration": calibration,
        "outputs": [list(o.outputs[0].token_ids) for o in outs],
        "timings": {k: round(v, 2) for k, v in timings.items()},
        **to_json(verdict),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moegate.offload.engine", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--json", required=True, type=Path)
    parser.add_argument("--budget-gb", type=float, default=64.0, help="cpu_offload_gb (0: no offload, the control)")
    parser.add_argument("--segments", default="experts", help="cpu_offload_params, comma-separated")
    parser.add_argument("--moe-backend", default="triton")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args(argv)

    try:
        if args.budget_gb < 0 or args.max_tokens < 1:
            raise OffloadInputError("--budget-gb must be >= 0 and --max-tokens >= 1")
        try:
            TinyMoESpec.from_model_dir(args.model)
        except ValueError as exc:
            raise OffloadInputError(f"--model {args.model}: {exc}") from None
        segments = [s for s in args.segments.split(",") if s]
        report = run(args.model, args.budget_gb, segments, args.moe_backend, args.max_tokens)
    except OffloadInputError as exc:
        print(f"moegate.offload.engine: {exc}", file=sys.stderr)
        return 2
    atomic_write(args.json, json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"moegate.offload.engine: {report['verdict']}: wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
