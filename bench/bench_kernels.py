"""Kernel-tier speed: generated cases checked per second on one GPU (vLLM start-up excluded).

Each case is exactly what ``test_output_matches_reference`` checks: draw a case
from ``strategies.kernels`` (both entrypoints, every placement, expert maps,
wNa16 and, on fp8-capable GPUs, fp8 weights), run it through vLLM with cached weights, compare with the torch
reference under the stated tolerance, and check the path against the spec.
The clock starts after ``VllmTarget()`` (vLLM import and start-up) and includes
Triton compilation, weight drawing and pinning.

    PYTHONPATH=. python bench/bench_kernels.py --cases 500 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from moegate.kernel_check import run_checked
from moegate.kernel_inputs import WeightBank
from moegate.reference import rounding_count
from moegate.spec import expected_path
from moegate.tensors import torch_dtype
from moegate.vllm.environment import describe_environment
from moegate.vllm.target import VllmTarget
from strategies.kernels import kernel_cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop drawing once this many seconds have passed")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t_import = time.perf_counter()
    target = VllmTarget()
    if not target.cuda:
        print("bench_kernels: needs a CUDA GPU", file=sys.stderr)
        return 2
    startup = time.perf_counter() - t_import
    bank = WeightBank(target.device, target.host_view)
    stats: Counter[str] = Counter()
    worst: dict[str, float] = {}
    fp8 = torch.cuda.get_device_capability() >= (8, 9)
    schemes = None if fp8 else "wna16"  # fp8_w8a8 needs fp8 tensor cores
    failures: list[str] = []
    start = time.perf_counter()

    @settings(
        max_examples=args.cases,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def one(data: st.DataObject) -> None:
        if time.perf_counter() - start > args.budget_s:
            stats["skipped_over_budget"] += 1
            return
        entrypoint = data.draw(st.sampled_from(("legacy", "modular")))
        case = data.draw(kernel_cases(entrypoint, expert_map=None, quant=None, schemes=schemes))
        r = run_checked(target, bank, case, entrypoint)
        # the figures the tolerance rules are calibrated on: worst error in units of u*(A + rms A) per
        # numeric family; for fp8, the worst err/tol of each stage of the staged check
        if case.quant is None or case.quant.weight_only:
            family = ("unquantized-" + case.dtype) if case.quant is None else "wNa16"
            units = r.closeness.worst_ratio * rounding_count(torch_dtype(case.dtype), case.quant)
            worst[family] = max(worst.get(family, 0.0), units)
        else:
            for stage, ratio in (r.closeness.stages or {}).items():
                key = f"fp8-g{max(case.quant.group_size, 0)} {stage} (err/tol)"
                worst[key] = max(worst.get(key, 0.0), ratio)
        stats["cases"] += 1
        stats[f"path_{r.path}"] += 1
        stats[f"placement_{case.placement.label}"] += 1
        if case.quant is not None:
            stats[f"quant_{case.quant.scheme}"] += 1
        if case.expert_map is not None:
            stats["expert_map"] += 1
        if not r.closeness.ok:
            stats["numeric_fail"] += 1
            failures.append(r.describe())
        if r.path != expected_path(case, entrypoint).path.value:
            stats["path_mismatch"] += 1
            if len(failures) < 20:
                failures.append("path mismatch: " + r.describe())

    one()
    elapsed = time.perf_counter() - start
    n = stats["cases"]
    print(
        f"bench_kernels: vLLM {target.version}: {n} cases in {elapsed:.1f} s ({n / elapsed:.2f} cases/s), "
        f"start-up {startup:.1f} s excluded; {dict(stats)}"
    )
    print(
        "worst |out-ref| in units of u*(A + rms A), fp8 stages as err/tol: "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(worst.items()))
    )
    for f in failures[:10]:
        print("  " + f.replace("\n", "\n  "))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "env": describe_environment(),
                    "vllm": target.version,
                    "cases": n,
                    "seconds": elapsed,
                    "startup_seconds": startup,
                    "stats": dict(stats),
                    "worst_error_units": worst,
                    "failures": failures[:50],
                },
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
