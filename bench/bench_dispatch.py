"""Dispatch-tier throughput: generated cases per second, each case through both entrypoints.

Target (issue 2): 10,000 cases in at most 60 s on the 2-core CPU machine against
vLLM 0.33.0, vLLM's import excluded. The run is the dispatch tier's own general
property (spec check at both entrypoints) under Hypothesis, so generation,
per-case set-up and the vLLM calls are all counted.

    nox -s bench                 # or: python bench/bench_dispatch.py --cases=10000
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.cases < 1:
        parser.error("--cases must be at least 1")

    t_import = time.perf_counter()
    from moegate.dispatch.names import TargetError
    from moegate.dispatch.target import VllmTarget
    from moegate.kernels.inputs import WeightBank

    try:
        target = VllmTarget(weights=WeightBank)  # on a GPU the default runs each case to the end
    except TargetError as exc:
        print(f"bench_dispatch: {exc}", file=sys.stderr)
        return 2
    import_s = time.perf_counter() - t_import

    from hypothesis import HealthCheck, given, settings

    from moegate.core.case import ENTRYPOINTS
    from moegate.core.check import assert_path
    from moegate.strategies import moe_cases

    count = [0]

    @settings(
        max_examples=args.cases,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(case=moe_cases(expert_map=None, quant=None))
    def run(case):
        count[0] += 1
        for ep in ENTRYPOINTS:
            assert_path(target, case, ep)

    t0 = time.perf_counter()
    run()
    wall = time.perf_counter() - t0
    figures = {
        "vllm": target.version,
        "cases": count[0],
        "calls": count[0] * len(ENTRYPOINTS),
        "wall_s": round(wall, 2),
        "cases_per_s": round(count[0] / wall, 1),
        "vllm_import_s_excluded": round(import_s, 2),
        "machine": f"{platform.machine()} {platform.python_version()}",
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    target.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
