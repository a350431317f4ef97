"""Start one vLLM server until it answers ``/health``, then stop it: a build's compile cache, filled ahead of an A/B.

    python3 -m lab.gpu.warm_server PYTHON MODEL LOG [SERVER_ARGS] [--env KEY=VALUE ...]

A device session starts with empty caches: the first start of each build on a model compiles and captures the
graphs that every later start reads back (how long each takes, cold and warm: results/ab-text-graphs-h200.md). A
runner that keeps ``VLLM_CACHE_ROOT`` between runs has them warm; on the device
the A/B's text run gets them warm by this start, made in the background while other GPU work runs. It measures
nothing, so it may share the GPU: its ``--gpu-memory-utilization`` and ``--kv-cache-memory-bytes`` are appended
after ``SERVER_ARGS`` (vLLM's compile-cache key leaves both out: ``CacheConfig.compute_hash`` ignores
``gpu_memory_utilization`` and ``kv_cache_memory_bytes``), and the rest must be the A/B's own flags and model path,
which the key does hold. A fixed KV size skips vLLM's memory profiling, which other processes starting and stopping
on the GPU at the same time can upset (the e2e plan's servers share the GPU the same way).

Prints one line, the time to a healthy server; exit 1 with the server's error lines when it does not come up.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from moegate.serve.build import Build, env_pairs
from moegate.serve.server import Server, ServerError


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lab.gpu.warm_server", description=__doc__.splitlines()[0])
    ap.add_argument("python", help="the build's interpreter")
    ap.add_argument("model", help="the model path the A/B serves (part of the compile-cache key)")
    ap.add_argument("log", type=Path, help="the server's log")
    ap.add_argument("server_args", nargs="?", default="", help="the A/B's server flags, one string")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="as the A/B's --*-env")
    ap.add_argument("--util", type=float, default=0.15, help="GPU memory share while other work runs (0.15)")
    ap.add_argument("--kv-bytes", type=int, default=2 << 30, help="KV cache bytes (2 GiB)")
    ap.add_argument("--startup-timeout-s", type=float, default=600)
    opts = ap.parse_args(argv)
    try:
        env = env_pairs(opts.env)
    except ValueError as exc:
        ap.error(str(exc))
    if not 0 < opts.util <= 1:
        ap.error(f"--util is a share of GPU memory in (0, 1], got {opts.util}")
    if opts.kv_bytes <= 0:
        ap.error(f"--kv-bytes is a positive number of bytes, got {opts.kv_bytes}")
    args = [*shlex.split(opts.server_args), "--gpu-memory-utilization", str(opts.util)]
    args += ["--kv-cache-memory-bytes", str(opts.kv_bytes)]
    t0 = time.monotonic()
    try:
        with Server(Build("warm", opts.python, env), opts.model, args, log_path=opts.log,
                    startup_timeout_s=opts.startup_timeout_s):  # fmt: skip
            print(f"warm {opts.python}: healthy in {time.monotonic() - t0:.0f} s (log {opts.log})")
    except ServerError as exc:
        print(f"warm {opts.python}: no healthy server: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
