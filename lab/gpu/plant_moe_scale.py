"""A planted bug for the aggregate check: a copy of vLLM whose fused-MoE output is (1 + eps) times too large.

Copies the ``vllm`` package found under ``--site`` to ``--dest`` (the installed
files are not touched) and, in the copy only, wraps both entrypoints the kernel
tier drives, ``fused_experts`` (legacy) and ``TritonExperts.apply`` /
``TritonWNA16Experts.apply`` (modular), so that they multiply the router weights
by ``1 + eps`` (``eps`` read from ``$MOEGATE_PLANT_EPS`` at each call, 0 when
unset) wherever the weights scale the second product: the float32 accumulator of
every expert's output is then ``1 + eps`` too large before its rounding, on every
path and placement (a renormalisation that drifts). Calls with the router weight
on the input (top-1; the weight goes through the activation) are left as they are.
Scaling the rounded output instead would be no such error in bfloat16: 1.002
times a bfloat16 value rounds back to it unless its mantissa is above 1.95.

Run it in a build whose sites are DEST, then SITE, so the copy shadows the installed package
(an interpreter, ``python -m moegate.builds.planted``; from the checkout root, which ``-m`` puts on the path):

    python3 -m lab.gpu.plant_moe_scale --site $HOME/agg-vllm-site --dest $HOME/agg-vllm-plant
    python3 -m moegate.builds.planted $HOME/agg-plant-build --python python3 \\
        --site $HOME/agg-vllm-plant --site $HOME/agg-vllm-site
    MOEGATE_PLANT_EPS=0.002 $HOME/agg-plant-build/bin/python -m pytest tests/kernels

Exit 2 with one line when the site has no vLLM or a wrapped name is not where it
is expected (the patch is checked, not assumed).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

WRAPPER = """

# --- planted by moegate's lab/gpu/plant_moe_scale.py: router weights (1 + $MOEGATE_PLANT_EPS) ---
import inspect as _moegate_inspect
import os as _moegate_os


def _moegate_plant(fn):
    sig = _moegate_inspect.signature(fn)

    def planted(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        eps = float(_moegate_os.environ.get("MOEGATE_PLANT_EPS", "0"))
        if eps and not bound.arguments.get("apply_router_weight_on_input", False):
            bound.arguments["topk_weights"] = bound.arguments["topk_weights"] * (1.0 + eps)
        return fn(*bound.args, **bound.kwargs)

    planted.__wrapped__ = fn
    return planted


"""
PLANTS = {
    "model_executor/layers/fused_moe/fused_moe.py": (
        "def fused_experts(",
        ["fused_experts = _moegate_plant(fused_experts)"],
    ),
    "model_executor/layers/fused_moe/experts/triton_moe.py": (
        "class TritonWNA16Experts(",
        [
            "TritonExperts.apply = _moegate_plant(TritonExperts.apply)",
            "TritonWNA16Experts.apply = _moegate_plant(TritonWNA16Experts.apply)",
        ],
    ),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--site", required=True, type=Path)
    ap.add_argument("--dest", required=True, type=Path)
    args = ap.parse_args(argv)
    src = args.site / "vllm"
    for rel, (marker, _) in PLANTS.items():
        path = src / rel
        if not path.is_file() or marker not in path.read_text():
            print(f"plant_moe_scale: {path} is missing or lacks {marker!r}; nothing planted", file=sys.stderr)
            return 2
    if args.dest.exists():
        shutil.rmtree(args.dest)
    args.dest.mkdir(parents=True)
    shutil.copytree(src, args.dest / "vllm", symlinks=True)
    for rel, (_, lines) in PLANTS.items():
        path = args.dest / "vllm" / rel
        path.write_text(path.read_text() + WRAPPER + "\n".join(lines) + "\n")
    print(f"plant_moe_scale: {args.dest / 'vllm'}: router weights scaled by 1 + $MOEGATE_PLANT_EPS at both entrypoints")
    return 0


if __name__ == "__main__":
    sys.exit(main())
