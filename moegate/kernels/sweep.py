"""Kernel-tier speed: generated cases checked per second on one GPU (vLLM start-up excluded).

Each case is exactly what ``test_output_matches_reference`` checks: draw a case
from ``moegate.strategies.kernels`` (both entrypoints, every placement, expert maps,
wNa16 and, on fp8-capable GPUs, fp8 weights), run it through vLLM with cached weights, compare with the torch
reference under the stated tolerance, and check the path against the spec.

``--workers N`` runs the cases in N processes on the one GPU, sharing Triton's
disk cache (``moegate/kernels/workers.py`` says how and why); the cases come from
one Hypothesis run seeded with ``--seed``, so a seed gives the same cases for any
N. The clock starts when the workers are released, after vLLM's import and
CUDA's start-up in each, and stops when the last one has finished; it includes
Triton compilation, weight drawing and pinning, and the drawing of the cases.
The Triton cache used, and its entries before and after, say whether the run was
cold or warm (``--triton-cache DIR``, else ``TRITON_CACHE_DIR``, else Triton's default).

    python -m moegate.kernels.sweep --cases 500 --json out.json
    python -m moegate.kernels.sweep --cases 5000 --workers 8 --triton-cache /tmp/cold --json out.json

Exit 1 when a case fails a check (numerics or path), or when the aggregate check
(``moegate.kernels.systematic``: a relative error common to a group's cases, per entrypoint,
placement and dtype family) detects one; its per-group summary is printed and goes
into the JSON (``systematic``). So a nightly sweep of 5,000 cases (``nox -s
kernel-sweep``) gates on the same checks it times.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from moegate.core import progress
from moegate.core.case import ENTRYPOINTS, MoECase
from moegate.core.golden_files import atomic_write
from moegate.dispatch import names  # a leaf: no vLLM import
from moegate.kernels.resources import auto_workers, cache_entries, triton_cache_dir
from moegate.kernels.runner import VllmRunner
from moegate.kernels.systematic import summarise
from moegate.kernels.tally import Pass, profile_line
from moegate.kernels.workers import Options, Pool, WorkerFailed
from moegate.strategies.kernels import kernel_cases

PREFIX = "bench_kernels"
GIB = 2**30


def draw_cases(
    n: int, seed_value: int, strategies: Mapping[str, st.SearchStrategy[MoECase]], sink: Callable[[MoECase, str], None]
) -> None:
    """Draw ``n`` cases, entrypoint first, in one Hypothesis run seeded with ``seed_value``; hand each to ``sink``.

    No database and generation only: the same seed gives the same cases in the same order.
    """

    @seed(seed_value)
    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate],
        suppress_health_check=[HealthCheck.too_slow],  # the GPU's time is not the strategy's
    )
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        entrypoint = data.draw(st.sampled_from(ENTRYPOINTS))
        sink(data.draw(strategies[entrypoint]), entrypoint)

    one()


def write_report(path: Path, report: Mapping[str, Any]) -> None:
    """The JSON report whole or not at all: serialised first, then written atomically."""
    atomic_write(path, json.dumps(report, indent=1) + "\n")


def _check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, in one line, or None."""
    if args.cases < 1 or args.budget_s <= 0:
        return "--cases and --budget-s must be positive"
    if args.workers != "auto" and not (args.workers.isdigit() and 1 <= int(args.workers) <= args.cases):
        return f"--workers must be auto or between 1 and --cases ({args.cases}); got {args.workers}"
    if args.cprofile and not args.profile:
        return "--cprofile needs --profile"
    return None


def _memory_line(index: int, cases: int, seconds: float, memory: Mapping[str, int]) -> str:
    return (
        f"{PREFIX}: worker {index}: {cases} cases, busy {seconds:.1f} s; peak GPU memory "
        f"{memory['peak_allocated'] / GIB:.1f} GiB allocated, {memory['peak_reserved'] / GIB:.1f} GiB reserved; "
        f"weights {memory['weights_device'] / GIB:.1f} GiB on the device, {memory['weights_pinned'] / GIB:.1f} GiB pinned"
    )


def _pass_json(p: Pass) -> dict[str, Any]:
    return {
        "seconds": p.seconds,
        "stages": p.stages,
        "worker_seconds": p.worker_seconds,
        "cases": p.tally.stats["cases"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moegate.kernels.sweep", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument(
        "--budget-s", type=float, default=300.0, help="stop running cases once this many seconds have passed"
    )
    ap.add_argument(
        "--workers",
        default="1",
        help="processes on the one GPU, or auto: as many as its memory, the host's and the cores hold (docs/design/kernels.md)",
    )
    ap.add_argument("--seed", type=int, default=0, help="Hypothesis seed: the same seed gives the same cases, any N")
    ap.add_argument("--triton-cache", default=None, metavar="DIR", help="Triton's disk cache for this run")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--profile",
        action="store_true",
        help="time each stage (inputs, vLLM, reference) with a synchronisation after each, then replay each worker's "
        "cases once more in the same process: the difference is Triton compilation and first-touch costs",
    )
    ap.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="N",
        help="with --profile: cProfile worker 0's replay, print the top N",
    )
    args = ap.parse_args(argv)
    problem = _check_args(args)
    if problem:
        print(f"{PREFIX}: {problem}", file=sys.stderr)
        return 2
    if importlib.util.find_spec(names.PACKAGE) is None:
        print(f"{PREFIX}: vLLM is not importable here; the kernel tier needs vLLM and a CUDA GPU", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print(f"{PREFIX}: needs a CUDA GPU; torch {torch.__version__} sees none", file=sys.stderr)
        return 2

    if args.workers == "auto":
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        gpu = torch.cuda.get_device_properties(0).total_memory
        args.workers = min(args.cases, auto_workers(gpu, host, os.cpu_count() or 1))
        print(f"{PREFIX}: --workers auto: {args.workers} ({gpu / GIB:.0f} GiB GPU, {host / GIB:.0f} GiB host)")
    else:
        args.workers = int(args.workers)
    cache, source = triton_cache_dir(args.triton_cache, os.environ)
    os.environ["TRITON_CACHE_DIR"] = str(cache)  # the workers inherit it: one cache for all
    entries_start = cache_entries(cache)
    print(f"{PREFIX}: Triton cache {cache} ({source}): {entries_start} entries at start", flush=True)
    if os.environ.get("TRITON_CACHE_MANAGER"):
        print(f"{PREFIX}: TRITON_CACHE_MANAGER is set: the workers may not share the cache above", flush=True)
    threads = max(1, (os.cpu_count() or 1) // args.workers) if args.workers > 1 else 0
    options = Options(args.budget_s, args.profile, args.cprofile, threads)
    try:
        with Pool(args.workers, VllmRunner, options) as pool:
            t0 = time.perf_counter()
            with progress.stage("start-up", args.workers, prefix=PREFIX, unit="workers ready") as up:
                pool.on_ready = up.advance
                info = pool.start()
            startup = time.perf_counter() - t0
            for i, worker in sorted(info.items()):
                if worker["triton_cache"] not in (None, str(cache)):
                    print(f"{PREFIX}: worker {i} uses Triton cache {worker['triton_cache']}, not {cache}", flush=True)
            first = info[0]
            schemes = None if all(w["fp8"] for w in info.values()) else "wna16"  # fp8_w8a8 needs fp8 tensor cores
            strategies = {ep: kernel_cases(ep, expert_map=None, quant=None, schemes=schemes) for ep in ENTRYPOINTS}
            with progress.stage("kernel cases", args.cases, prefix=PREFIX, counts=("failed",)) as bar:
                pool.on_case = lambda failed: bar.advance(failed=int(failed))
                pool.release()
                draw_cases(args.cases, args.seed, strategies, pool.submit)
                cold = pool.finish()
            entries_end = cache_entries(cache)
            warm, cprofile_text = None, ""
            if args.profile:
                with progress.stage("warm replay", prefix=PREFIX):
                    warm, cprofile_text = pool.replay()
    except WorkerFailed as exc:
        for i, text in exc.errors.items():
            print(f"{PREFIX}: worker {i} failed:\n  " + text.strip().replace("\n", "\n  "), file=sys.stderr)
        print(f"{PREFIX}: {exc}", file=sys.stderr)
        return 1

    tally = cold.tally
    stats, worst, failures = tally.stats, tally.worst, tally.failures
    n = stats["cases"]
    print(
        f"{PREFIX}: vLLM {first['vllm']}: {n} cases in {cold.seconds:.1f} s ({n / max(cold.seconds, 1e-9):.2f} cases/s), "
        f"start-up {startup:.1f} s excluded, workers {args.workers}; {dict(stats)}"
    )
    print(
        "worst |out-ref| in units of u*(A + rms A), fp8 stages as err/tol: "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(worst.items()))
    )
    for f in failures[:10]:
        print("  " + f.replace("\n", "\n  "))
    aggregate = summarise(tally.samples)
    print("\n".join(aggregate.lines()))
    print(
        f"{PREFIX}: Triton cache {cache}: {entries_start} entries at start, {entries_end} at the end, "
        f"{entries_end - entries_start} new (about one per compilation); seed {args.seed}"
    )
    for r in cold.workers:
        print(_memory_line(r.index, r.tally.stats["cases"], r.seconds, r.memory))
    profile: dict[str, Any] = {}
    if warm is not None:
        label = f", {args.workers} workers" if args.workers > 1 else ""
        print(profile_line(f"first pass (cold){label}", cold))
        print(profile_line(f"replay of the same cases (warm){label}", warm))
        if cprofile_text:
            print("cProfile of worker 0's replay:\n" + cprofile_text)
        profile = {"cold": _pass_json(cold), "warm_replay": _pass_json(warm)}
    if args.json:
        report = {
            "env": first["env"],
            "vllm": first["vllm"],
            "cases": n,
            "seconds": cold.seconds,
            "startup_seconds": startup,
            "stats": dict(stats),
            "worst_error_units": worst,
            "failures": failures[:50],
            "systematic": aggregate.to_json(),
            "profile": profile,
            "workers": args.workers,
            "seed": args.seed,
            "budget_s": args.budget_s,
            "triton_cache": {
                "dir": str(cache),
                "source": source,
                "entries_start": entries_start,
                "entries_end": entries_end,
                "new": entries_end - entries_start,
            },
            "per_worker": [
                {
                    "index": r.index,
                    "cases": r.tally.stats["cases"],
                    "seconds": r.seconds,
                    "stages": r.stages,
                    **r.memory,
                }
                for r in cold.workers
            ],
        }
        write_report(Path(args.json), report)
    failed = stats["numeric_fail"] + stats["path_mismatch"]
    if failed:
        print(f"{PREFIX}: {failed} of {n} cases failed the kernel tier's checks (listed above)", file=sys.stderr)
    if aggregate.detected:
        print(f"{PREFIX}: {aggregate.failure_message()}", file=sys.stderr)
    return 1 if failed or aggregate.detected else 0


if __name__ == "__main__":
    sys.exit(main())
