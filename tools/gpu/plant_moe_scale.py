"""A planted bug for the aggregate check: a copy of vLLM whose fused-MoE output is (1 + eps) times too large.

Copies the ``vllm`` package found under ``--site`` to ``--dest`` (the installed
files are not touched) and, in the copy only, makes ``vllm._custom_ops.moe_sum``
(the top-k sum every Triton fused-MoE path ends with: ``fused_experts_impl`` at
the legacy entrypoint, ``TritonExperts`` and ``TritonWNA16Experts`` at the
modular one, naive and sorted, device and host-resident weights alike) multiply
its output by ``1 + eps``, with ``eps`` read from ``$MOEGATE_PLANT_EPS`` at each
call (0 when unset). Run with ``PYTHONPATH=DEST:SITE`` so the copy shadows the
installed package and the rest of the site still resolves.

    python3 tools/gpu/plant_moe_scale.py --site $HOME/vllm-site --dest $HOME/vllm-plant
    MOEGATE_PLANT_EPS=0.002 PYTHONPATH=$HOME/vllm-plant:$HOME/vllm-site:. python3 -m pytest tests/kernels

Exit 2 with one line when the site has no vLLM or the function is not where it
is expected (the patch is checked, not assumed).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

TARGET = "    torch.ops._moe_C.moe_sum(input, output, topk_ids, expert_map)\n"
PLANT = TARGET + (
    "    import os as _moegate_os  # planted by moegate's tools/gpu/plant_moe_scale.py\n"
    "    output.mul_(1.0 + float(_moegate_os.environ.get('MOEGATE_PLANT_EPS', '0')))\n"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--site", required=True, type=Path)
    ap.add_argument("--dest", required=True, type=Path)
    args = ap.parse_args(argv)
    src = args.site / "vllm"
    ops = src / "_custom_ops.py"
    if not ops.is_file():
        print(f"plant_moe_scale: no vLLM package at {src}", file=sys.stderr)
        return 2
    text = ops.read_text()
    if text.count(TARGET) != 1:
        print(f"plant_moe_scale: {ops} does not call _moe_C.moe_sum once as expected; nothing planted", file=sys.stderr)
        return 2
    if args.dest.exists():
        shutil.rmtree(args.dest)
    args.dest.mkdir(parents=True)
    shutil.copytree(src, args.dest / "vllm", symlinks=True)
    (args.dest / "vllm" / "_custom_ops.py").write_text(text.replace(TARGET, PLANT))
    print(f"plant_moe_scale: {args.dest / 'vllm'} scales moe_sum's output by 1 + $MOEGATE_PLANT_EPS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
