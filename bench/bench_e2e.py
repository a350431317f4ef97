"""The e2e gates' cost on this machine: wall time and peak memory of one gate between two builds.

    python bench/bench_e2e.py --gate greedy --vllm-python PY --model DIR [--prompts 32 --max-tokens 128]
    python bench/bench_e2e.py --gate gsm8k --vllm-python PY --eval-python PY --model DIR [--gsm8k-limit 50]

Runs ``python -m moegate.e2e run`` exactly as a user would (both server starts included)
and samples the resident memory of its whole process tree (the driver, each server and
its engine core, lm-eval) every half second. The figures in the README come from here;
targets on the project's 2-core machine: each gate under 10 minutes and under 8 GiB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moegate.paths import ROOT
from tooling import serving

CPU_ARGS = serving.CPU_SERVER_ARGS


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and every descendant (from /proc; no psutil needed)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            pid, ppid = int(entry.name), int(fields[1])
            rss[pid] = int((entry / "statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gate", choices=("greedy", "gsm8k"), required=True)
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--eval-python", default="")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--gsm8k-limit", type=int, default=50)
    ap.add_argument("--server-args", default=CPU_ARGS)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    cmd = [
        sys.executable, "-m", "moegate.e2e", "run", f"--base={args.vllm_python}", f"--pr={args.vllm_python}",
        f"--model={args.model}", f"--server-args={args.server_args}", f"--gates={args.gate}",
        f"--prompts={args.prompts}", f"--max-tokens={args.max_tokens}", f"--gsm8k-limit={args.gsm8k_limit}",
        f"--out={out / 'run'}", f"--report={out / 'e2e.md'}",
        *([f"--eval-python={args.eval_python}"] if args.eval_python else []),
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss_bytes(proc.pid))
        time.sleep(0.5)
    wall = time.monotonic() - t0
    err = proc.stderr.read() if proc.stderr else ""
    size = (
        f"{args.prompts} prompts x {args.max_tokens} tokens"
        if args.gate == "greedy"
        else f"{args.gsm8k_limit} questions"
    )
    print(
        f"{args.gate} gate, two builds ({size}): exit {proc.returncode}, wall {wall:.0f} s, "
        f"peak memory of the process tree {peak / 2**30:.2f} GiB; report {out / 'e2e.md'}"
    )
    if proc.returncode not in (0, 1):
        print(err[-2000:], file=sys.stderr)
    return 0 if proc.returncode in (0, 1) else proc.returncode


if __name__ == "__main__":
    raise SystemExit(main())
