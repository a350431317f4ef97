"""Naive vs sorted step time with host-resident (UVA) expert weights, against the traffic model.

Qwen3-30B-A3B expert shapes (128 experts, top-8, hidden 2048, intermediate 768,
bfloat16), all weights in pinned host memory behind vLLM's UVA view. Each path
is reached through the legacy ``fused_experts`` the same way on every release:

- naive:  unmarked UVA weights (vLLM cannot tell they are on the host), and a
  global expert count large enough that ``tokens*8*4 <= experts`` (256 at 8 tokens);
- sorted: the same weights with an identity expert map (always aligns);
- marked: the weights marked as the UVA offloader marks them, no map: what the
  release under test does in production (0.33.0 sorted, 0.32.0 naive).

Reports per (routing, tokens): step time of each mode (median of timed reps, L2
flushed between reps, routing varied per rep), measured naive/sorted time ratio vs the
model's byte ratio, the sorted path's achieved host-read bandwidth against the
UVA peak measured here (a device copy reading a pinned buffer through a UVA view).

    python bench/bench_traffic.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from moegate.core.case import MoECase, Routing, RoutingKind
from moegate.dispatch.environment import describe_environment
from moegate.dispatch.target import VllmTarget
from moegate.kernels.traffic import ExpertBytes, step_traffic

E, TOP_K, HIDDEN, INTER = 128, 8, 2048, 768
TOKENS = (1, 2, 3, 4, 8)
SLEEP_CYCLES = 5_000_000  # ~2.5 ms at 1.98 GHz, longer than vLLM's Python path takes to launch a step
BLOCK_M_MIN = 16  # smallest BLOCK_SIZE_M vLLM's configs use: >= 8 tokens' pairs per expert, one block each


def uva_peak(target: VllmTarget, gib: float = 2.0, reps: int = 5) -> dict[str, float]:
    """GB/s of a device kernel reading pinned host memory through a UVA view, and of a DMA copy."""
    n = int(gib * (1 << 30)) // 2
    src = torch.empty(n, dtype=torch.bfloat16).normal_()
    view = target.host_view(src, mark=False)
    dst = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    out = {}
    for name, fn in (
        ("uva_read", lambda: dst.copy_(view)),
        ("dma_h2d", lambda: dst.copy_(view._moegate_pinned, non_blocking=True)),
    ):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        out[name + "_GBps"] = n * 2 / min(times) / 1e9
    return out


def routings(kind: str, tokens: int, reps: int) -> list[list[list[int]]]:
    out = []
    for r in range(reps):
        if kind == "uniform":
            routing = Routing(RoutingKind.UNIFORM, seed=1000 * tokens + r)
        else:  # each token's 8 experts drawn from a shared pool of 8-24 (results/kernels-0.33.0.md's skewed rows)
            routing = Routing(RoutingKind.SKEWED, seed=1000 * tokens + r, pool=8 + (r % 3) * 8)
        out.append(routing.topk_ids(tokens, TOP_K, E))
    return out


def time_mode(target, x, w1, w2, rows, weights, flush, global_e, emap) -> tuple[float, str]:
    """Median step time and observed path; an error in one mode is reported, not fatal."""
    try:
        return _time_mode(target, x, w1, w2, rows, weights, flush, global_e, emap)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return float("nan"), f"error: {type(exc).__name__}: {exc}"[:200]


def _time_mode(target, x, w1, w2, rows, weights, flush, global_e, emap) -> tuple[float, str]:
    ids_all = [torch.tensor(r, dtype=torch.int32, device="cuda") for r in rows]
    path = ""
    for ids in ids_all[:3]:  # warm-up (compile) and path check
        path = target.call_legacy(x, w1, w2, weights, ids, global_num_experts=global_e, expert_map=emap).path
    torch.cuda.synchronize()
    times = []
    for ids in ids_all:
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)  # GPU busy while Python queues the call: time excludes launch overhead
        a.record()
        target.call_legacy(x, w1, w2, weights, ids, global_num_experts=global_e, expert_map=emap)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times), path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    target = VllmTarget()
    if not target.cuda:
        print("bench_traffic: needs a CUDA GPU (host-resident weights are a UVA view)", file=sys.stderr)
        return 2
    env = describe_environment()
    peak = uva_peak(target)
    print(
        f"vLLM {target.version}; UVA read peak {peak['uva_read_GBps']:.1f} GB/s, pinned DMA {peak['dma_h2d_GBps']:.1f} GB/s"
    )
    g = torch.Generator(device="cuda").manual_seed(0)
    w1d = (torch.randn(E, 2 * INTER, HIDDEN, generator=g, device="cuda") / HIDDEN**0.5).bfloat16()
    w2d = (torch.randn(E, HIDDEN, INTER, generator=g, device="cuda") / INTER**0.5).bfloat16()
    plain1, plain2 = target.host_view(w1d, mark=False), target.host_view(w2d, mark=False)
    marked1, marked2 = target.host_view(w1d), target.host_view(w2d)
    del w1d, w2d
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # > 60 MB L2
    identity = torch.arange(E, dtype=torch.int32, device="cuda")
    per = ExpertBytes.of_case(MoECase(num_tokens=1, top_k=TOP_K, num_experts=E, hidden=HIDDEN, intermediate=INTER))
    rows_out = []
    for kind in ("uniform", "skewed"):
        for tokens in TOKENS:
            rows = routings(kind, tokens, args.reps)
            x = torch.randn(tokens, HIDDEN, device="cuda").bfloat16()
            weights = torch.full((tokens, TOP_K), 1.0 / TOP_K, device="cuda")
            naive_e = max(E, tokens * TOP_K * 4)
            t_naive, p_naive = time_mode(target, x, plain1, plain2, rows, weights, flush, naive_e, None)
            t_sorted, p_sorted = time_mode(target, x, plain1, plain2, rows, weights, flush, E, identity)
            t_marked, p_marked = time_mode(target, x, marked1, marked2, rows, weights, flush, E, None)
            traffic = [step_traffic(r, per, BLOCK_M_MIN) for r in rows]
            naive_b = statistics.mean(t.naive for t in traffic)
            sorted_b = statistics.mean(t.sorted for t in traffic)
            byte_ratio = statistics.mean(t.ratio for t in traffic)
            time_ratio = t_naive / t_sorted
            rec = {
                "routing": kind,
                "tokens": tokens,
                "naive_ms": t_naive * 1e3,
                "sorted_ms": t_sorted * 1e3,
                "marked_ms": t_marked * 1e3,
                "paths": {"naive": p_naive, "sorted": p_sorted, "marked": p_marked},
                "time_ratio": time_ratio,
                "byte_ratio": byte_ratio,
                "ratio_error_pct": 100 * (time_ratio / byte_ratio - 1),
                "sorted_GBps": sorted_b / t_sorted / 1e9,
                "naive_GBps": naive_b / t_naive / 1e9,
                "sorted_pct_of_uva_peak": 100 * sorted_b / t_sorted / 1e9 / peak["uva_read_GBps"],
                "marked_extra_reads_pct": 100 * (naive_b / sorted_b - 1) if p_marked == "naive" else 0.0,
            }
            rows_out.append(rec)
            print(
                f"{kind:8s} tokens={tokens}: naive {rec['naive_ms']:.2f} ms ({p_naive}), sorted {rec['sorted_ms']:.2f} ms "
                f"({p_sorted}), marked {rec['marked_ms']:.2f} ms ({p_marked}); time ratio {time_ratio:.3f} vs byte "
                f"ratio {byte_ratio:.3f} ({rec['ratio_error_pct']:+.1f}%); sorted {rec['sorted_GBps']:.1f} GB/s = "
                f"{rec['sorted_pct_of_uva_peak']:.0f}% of UVA peak",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"env": env, "vllm": target.version, "peak": peak, "rows": rows_out, "reps": args.reps}, fh, indent=1
            )
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"bench_traffic: {time.perf_counter() - t0:.1f} s")
    sys.exit(rc)
