"""One scenario of vLLM's offline engine on the tiny Qwen3-MoE, reported as JSON.

The e2e lifecycle test runs each scenario in its own process: the weights are
placed by vLLM's real loader (UVA offload of the expert parameters, then
``process_weights_after_loading`` inside its loading context), and the real
FusedMoE layer runs real forwards. This module imports no vLLM: the public API
it uses (``LLM``, ``SamplingParams``, ``EngineArgs`` for the kwarg check,
``LLM.apply_model``) comes through ``moegate.dispatch.offline``, and what it needs
from vLLM's internals — the marker name and the kernel-launch recorders — from
``moegate.dispatch.names`` and ``moegate.dispatch.target``.

    python -m moegate.model.engine --model DIR --scenario NAME --json OUT [--no-trace]

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the
recorders see its fused-MoE calls. Tracing needs CUDA (the calls run to the
end); ``--no-trace`` runs the same scenario without recorders, e.g. on the CPU
build as a smoke test.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegate.core.golden_files import atomic_write
from moegate.dispatch import offline
from moegate.dispatch.names import UVA_MARKER
from moegate.model.tiny_spec import TinyMoESpec

GIB = 1 << 30

ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the model runs here, where the recorders are
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
}

PROMPT_LENGTHS = (4, 5, 9, 16)
"""Prompt lengths in tokens. With top-8 of 128 experts, a 4-token prefill sits exactly on the
naive boundary (4*8*4 == 128), 5+ tokens are past it; the 4-prompt batch decodes 4 tokens a
step (on the boundary again), one prompt at a time decodes 1."""

DEFAULT_MAX_TOKENS = 24


@dataclass(frozen=True)
class Scenario:
    """Where the loader is asked to put the expert weights.

    ``offload_params`` are vLLM's ``cpu_offload_params`` segments (``None``: no
    offload); ``budget`` is ``"ample"`` (every matched parameter fits) or
    ``"one-w13"`` (exactly one layer's w13 bytes: the per-parameter cut-off stops
    after the first matched parameter, layer 0's w13).
    """

    name: str
    summary: str
    offload_params: frozenset[str] | None = None
    budget: str = "ample"

    def offload_kwargs(self, spec: TinyMoESpec) -> dict[str, Any]:
        if self.offload_params is None:
            return {}
        gb = spec.w13_bytes / GIB if self.budget == "one-w13" else max(1.0, 2 * spec.expert_bytes / GIB)
        return {"offload_backend": "uva", "cpu_offload_gb": gb, "cpu_offload_params": set(self.offload_params)}


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("device", "no offload: every expert weight in device memory"),
        Scenario("uva-all", "every layer's w13 and w2 UVA-offloaded", frozenset({"experts"})),
        Scenario(
            "budget-w13",
            "budget of one w13: layer 0's w13 on the host, its w2 and every later layer on the device",
            frozenset({"experts"}),
            budget="one-w13",
        ),
        Scenario(
            "select-w2",
            "every layer's w2 on the host, w13 on the device",
            # vLLM matches whole name segments relative to the decoder layer. In 0.32/0.33
            # the weights sit one level down (mlp.experts.routed_experts.w2_weight), where
            # the documented "experts.w2_weight" matches nothing; the second spelling is
            # for a layout that registers them on mlp.experts directly.
            frozenset({"routed_experts.w2_weight", "experts.w2_weight"}),
        ),
    )
}


class EngineInputError(ValueError):
    """Bad command-line input; reported as one line."""


def engine_kwargs(scenario: Scenario, spec: TinyMoESpec, *, cuda: bool, moe_backend: str | None) -> dict[str, Any]:
    """``vllm.LLM`` arguments for ``scenario``: small, eager, deterministic, no tokenizer, no prefix cache.

    Prefix caching is off so the batched run prefills whole prompts after the
    one-at-a-time run has cached them; async scheduling is off so every step's
    forward is done when ``generate`` returns.
    """
    kw: dict[str, Any] = {
        "dtype": "bfloat16",
        "seed": 0,
        "enforce_eager": True,
        "max_model_len": min(256, spec.max_positions),
        "skip_tokenizer_init": True,
        "enable_prefix_caching": False,
        "async_scheduling": False,
    }
    if cuda:
        kw["gpu_memory_utilization"] = 0.15
        kw["kv_cache_memory_bytes"] = offline.FIXED_KV_CACHE_BYTES  # no memory profiling: other GPU work can run beside
        # pin the Triton experts: the spec's "modular" entrypoint is TritonExperts.apply
        kw["moe_backend"] = moe_backend or "triton"
    elif moe_backend:
        kw["moe_backend"] = moe_backend
    kw.update(scenario.offload_kwargs(spec))
    return kw


def check_engine_kwargs(kwargs: dict[str, Any]) -> None:
    """Fail with one line naming any kwarg this vLLM's ``EngineArgs`` lacks (a rename between releases)."""
    known = offline.engine_arg_names()
    missing = sorted(k for k in kwargs if k not in known)
    if missing:
        raise EngineInputError(
            f"vLLM {offline.version()}'s EngineArgs lacks {missing}; moegate.model.engine needs them"
        )


def prompts(vocab: int, lengths: tuple[int, ...] = PROMPT_LENGTHS) -> list[list[int]]:
    """Fixed token-id prompts, the same in every scenario and process."""
    rng = random.Random(20261129)
    return [[rng.randrange(2, vocab) for _ in range(n)] for n in lengths]


def expert_markers(model: Any) -> dict[str, dict[str, Any]]:
    """Every expert weight of the loaded model, in registration order: UVA marker, shape, dtype.

    Runs inside the worker through ``LLM.apply_model``; returns plain data only.
    """
    return {
        name: {
            "marked": bool(getattr(p, UVA_MARKER, False)),
            "shape": list(p.shape),
            "dtype": str(p.dtype).removeprefix("torch."),
            "device": p.device.type,
        }
        for name, p in model.named_parameters()
        if "experts" in name and name.endswith(("w13_weight", "w2_weight"))
    }


def run_scenario(
    model_dir: Path, scenario: Scenario, *, trace: bool, max_tokens: int, moe_backend: str | None = None
) -> dict[str, Any]:
    """Build the engine, read the markers, generate one prompt at a time and as a batch (traced)."""
    import torch

    cuda = torch.cuda.is_available()
    if trace and not cuda:
        raise EngineInputError("tracing fused-MoE calls needs a CUDA GPU; pass --no-trace for a CPU smoke run")
    os.environ.update(ENGINE_ENV)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local checkpoint, no tokenizer: nothing to fetch
    if not cuda:
        # the CPU build otherwise sizes its KV cache to most of the machine's memory
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    spec = TinyMoESpec.from_model_dir(model_dir)
    kwargs = engine_kwargs(scenario, spec, cuda=cuda, moe_backend=moe_backend)
    check_engine_kwargs(kwargs)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    llm = offline.offline_engine(str(model_dir), **kwargs)
    timings["engine_init_s"] = time.perf_counter() - t0
    params = {}
    for worker in llm.apply_model(expert_markers):
        params.update(worker)

    target = None
    if trace:
        # After the engine is built: the recorders stop any call made outside a trace,
        # and the engine's start-up (profile and warm-up runs) must not be stopped.
        from moegate.dispatch.target import VllmTarget  # imports torch at its top: the module imports without it

        target = VllmTarget(finish=True)
    sampling = offline.greedy_sampling(max_tokens)
    ids = prompts(spec.vocab)
    runs: dict[str, Any] = {}
    try:
        for mode in ("single", "batch"):
            t0 = time.perf_counter()
            with target.trace() if target is not None else contextlib.nullcontext() as tr:
                if mode == "single":
                    outs = [llm.generate([{"prompt_token_ids": p}], sampling, use_tqdm=False)[0] for p in ids]
                else:
                    outs = llm.generate([{"prompt_token_ids": p} for p in ids], sampling, use_tqdm=False)
            timings[f"{mode}_s"] = time.perf_counter() - t0
            runs[mode] = {
                "outputs": [list(o.outputs[0].token_ids) for o in outs],
                "calls": [dataclasses.asdict(c) for c in tr.calls()] if tr is not None else None,
            }
    finally:
        if target is not None:
            target.close()

    return {
        "scenario": scenario.name,
        "summary": scenario.summary,
        "vllm": offline.version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "traced": trace,
        "model": dataclasses.asdict(spec),
        "engine_kwargs": {k: sorted(v) if isinstance(v, set) else v for k, v in kwargs.items()},
        "prompts": ids,
        "max_tokens": max_tokens,
        "markers": {name: p["marked"] for name, p in params.items()},
        "expert_params": params,
        "runs": runs,
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moegate.model.engine", description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a checkpoint directory (python -m moegate.model.tiny_model)")
    parser.add_argument("--scenario", required=True, help=f"one of {sorted(SCENARIOS)}")
    parser.add_argument("--json", required=True, type=Path, help="where to write the report")
    parser.add_argument("--no-trace", action="store_true", help="no kernel-launch recorders (CPU smoke runs)")
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--moe-backend", default=None, help="vLLM moe_backend (default: triton on CUDA)")
    args = parser.parse_args(argv)

    try:
        if args.scenario not in SCENARIOS:
            raise EngineInputError(f"unknown scenario {args.scenario!r}; expected one of {sorted(SCENARIOS)}")
        if args.max_tokens < 1:
            raise EngineInputError(f"--max-tokens must be >= 1, got {args.max_tokens}")
        try:
            TinyMoESpec.from_model_dir(args.model)
        except ValueError as exc:
            raise EngineInputError(f"--model {args.model}: {exc}") from None
        report = run_scenario(
            Path(args.model),
            SCENARIOS[args.scenario],
            trace=not args.no_trace,
            max_tokens=args.max_tokens,
            moe_backend=args.moe_backend,
        )
    except EngineInputError as exc:
        print(f"moegate.model.engine: {exc}", file=sys.stderr)
        return 2
    atomic_write(args.json, json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(f"moegate.model.engine: {args.scenario}: wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
