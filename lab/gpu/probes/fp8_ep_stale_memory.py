"""Does stale GPU memory reach the output of vLLM's fp8 per-tensor MoE with an expert map?

Why the kernel tier leaves out one combination (``strategies/kernels.py``): at the
legacy entrypoint, fp8_w8a8 with per-tensor scales and an expert map, vLLM drops the
remote experts' pairs at alignment, so their rows of the intermediate cache are never
written, yet the second product's dynamic per-tensor activation scale is taken over
every row. This probe runs one such case (4 tokens, top-8, 64 experts, rank 1 of 2)
through both entrypoints three times: with the allocator as it is, and with the block
vLLM's intermediate cache will reuse pre-filled with 1e4 or with NaN. An output that
changes with the fill depends on memory the call never wrote.

    python lab/gpu/probes/fp8_ep_stale_memory.py [--json out.json]

Needs a CUDA GPU with fp8 tensor cores (compute capability 8.9+) and vLLM; each
missing one is a one-line error and exit 2. Exit 0 either way the answer goes: it
reports, it does not gate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from moegate.core.case import ENTRYPOINTS, ExpertMap, MoECase, Quant
from moegate.dispatch.names import TargetError
from moegate.dispatch.target import VllmTarget
from moegate.kernels.check import reference_for
from moegate.kernels.inputs import WeightBank
from moegate.kernels.tolerance import compare

CASE = MoECase(
    num_tokens=4,
    top_k=8,
    num_experts=64,
    hidden=256,
    intermediate=128,
    expert_map=ExpertMap(ep_size=2, ep_rank=1),
    quant=Quant("fp8_w8a8", 0),
)
FILLS: dict[str, float | None] = {"none": None, "big": 1e4, "nan": float("nan")}
"""What the freed block the intermediate cache reuses holds before the call (None: left as it is)."""


def prefill_next_block(case: MoECase, value: float) -> None:
    """Allocate a block the size of the intermediate cache, fill it with ``value`` and free it.

    PyTorch's caching allocator hands the freed block to the next request of that size,
    which is the intermediate cache vLLM allocates inside the call.
    """
    rows = case.num_tokens * case.top_k * max(2 * case.intermediate, case.hidden)
    junk = torch.full((rows,), value, dtype=torch.bfloat16, device="cuda")
    del junk


def probe(target: VllmTarget, bank: WeightBank) -> list[dict[str, object]]:
    """One row per (entrypoint, fill): the path taken and the output against the reference."""
    rows: list[dict[str, object]] = []
    for entrypoint in ENTRYPOINTS:
        for fill, value in FILLS.items():
            tensors, w1, w2 = bank.inputs(CASE)
            if value is not None:
                prefill_next_block(CASE, value)
            obs = target.run_placed(CASE, entrypoint, tensors, w1, w2)
            if obs.output is None:
                raise SystemExit(f"fp8_ep_stale_memory: {entrypoint} did not complete (path {obs.path})")
            closeness = compare(obs.output, reference_for(CASE, tensors), torch.bfloat16, CASE.quant)
            rows.append(
                {
                    "entrypoint": entrypoint,
                    "stale_fill": fill,
                    "path": obs.path,
                    "closeness": str(closeness),
                    "ok": closeness.ok,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fp8_ep_stale_memory: needs a CUDA GPU; this machine has none", file=sys.stderr)
        return 2
    if torch.cuda.get_device_capability() < (8, 9):
        print("fp8_ep_stale_memory: fp8_w8a8 needs compute capability 8.9 or later", file=sys.stderr)
        return 2
    try:
        target = VllmTarget(finish=True)
    except TargetError as exc:
        print(f"fp8_ep_stale_memory: {exc}", file=sys.stderr)
        return 2
    try:
        rows = probe(target, WeightBank(target.device, target.host_view))
    finally:
        target.close()
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
