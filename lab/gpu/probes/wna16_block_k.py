"""Does vLLM's CUDA wNa16 kernel reject the BLOCK_SIZE_K vLLM's own heuristic picks for it?

Why the kernel tier leaves out int4 with group size 32 at the Qwen3-30B-A3B shape
(``strategies/kernels.py``): the kernel-tier benchmark crashed there on an H200.
At the legacy entrypoint vLLM sends int4 weights with group size 32, 64 or 128 at
small batches (at most six valid tokens per expert) to a CUDA kernel that accepts only BLOCK_SIZE_K / group
size in 1, 2, 4, 8; its block heuristic grows BLOCK_SIZE_K with the problem and can
pass 8 x 32.

Two parts. On any machine with vLLM: every (shape, GEMM, group, tokens, top-k) of
the kernel tier's space whose block the kernel would reject, from vLLM's heuristic
(``VllmTarget.wna16_cuda_block_k``). With ``--run`` on a CUDA GPU: the smallest of
them (1 token, top-3) through both entrypoints, with group size 32 and, as the
control, 64; each row says whether vLLM raised and with what.

    python lab/gpu/probes/wna16_block_k.py [--run] [--json out.json]

Found (H200, vLLM 0.33.0, 2026-11-29; ``lab/gpu/probes/README.md``): the legacy
group-32 call raises, the modular one (Triton's wNa16 kernel) and both group-64
controls run and match the reference.

Exit 0 either way the answer goes: it reports, it does not gate. No vLLM, or
``--run`` without a GPU: one line and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import torch

from moegate.core.case import ENTRYPOINTS, MoECase, Quant
from moegate.dispatch.names import TargetError
from moegate.dispatch.target import VllmTarget
from moegate.kernels.check import reference_for
from moegate.kernels.inputs import WeightBank
from moegate.kernels.tolerance import compare
from moegate.kernels.wna16_blocks import rejected
from moegate.strategies.kernels import BIG_SHAPE, MAX_KERNEL_TOKENS, WNA16_GROUP_SIZES
from moegate.strategies.moe import KERNEL_SHAPES


def rejected_anywhere(target: VllmTarget) -> list[dict[str, Any]]:
    """Every point of the kernel tier's int4 space whose block the CUDA kernel rejects."""
    tokens = range(1, MAX_KERNEL_TOKENS + 1)
    found = (rejected(target, shape, group, tokens) for shape in KERNEL_SHAPES for group in WNA16_GROUP_SIZES)
    return [dataclasses.asdict(r) for rows in found for r in rows]


def run_smallest(target: VllmTarget, bank: WeightBank) -> list[dict[str, Any]]:
    """The smallest rejected case and its group-64 control, through both entrypoints, all on the device."""
    experts, hidden, intermediate = BIG_SHAPE
    out = []
    for group, entrypoint in itertools.product((32, 64), ENTRYPOINTS):
        case = MoECase(
            num_tokens=1, top_k=3, num_experts=experts, hidden=hidden, intermediate=intermediate,
            quant=Quant("int4_w4a16", group),
        )  # fmt: skip
        row: dict[str, Any] = {"group": group, "entrypoint": entrypoint, "case": case.to_dict()}
        try:
            tensors, w1, w2 = bank.inputs(case)
            obs = target.run_placed(case, entrypoint, tensors, w1, w2)
            torch.cuda.synchronize()
            assert obs.output is not None
            closeness = compare(obs.output, reference_for(case, tensors), torch.bfloat16, case.quant)
            row.update(raised=None, path=obs.path, closeness=str(closeness), ok=closeness.ok)
        except RuntimeError as exc:
            row.update(raised=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
        out.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "case"}), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--run", action="store_true", help="also run the smallest rejected case on the GPU")
    parser.add_argument("--json", type=Path, help="also write the findings to this file")
    args = parser.parse_args(argv)
    if args.run and not torch.cuda.is_available():
        print("wna16_block_k: --run needs a CUDA GPU; this machine has none", file=sys.stderr)
        return 2
    try:
        target = VllmTarget(finish=args.run)
    except TargetError as exc:
        print(f"wna16_block_k: {exc}", file=sys.stderr)
        return 2
    try:
        found: dict[str, Any] = {"vllm": target.version, "rejected": rejected_anywhere(target)}
        print(f"wna16_block_k: vLLM {target.version}: {len(found['rejected'])} rejected blocks in the kernel tier's "
              "int4 space", flush=True)  # fmt: skip
        for row in found["rejected"][:5]:
            print("  " + json.dumps(row))
        if args.run:
            found["runs"] = run_smallest(target, WeightBank(target.device, target.host_view))
    finally:
        target.close()
    if args.json is not None:
        args.json.write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
