"""How do the tensor cores read a float32 operand of Triton's ``tl.dot``: truncated, rounded or in full?

Why ``moegate.kernels.systematic`` truncates float32 operands to TF32 (13 low mantissa
bits dropped) before its float32 reference: vLLM's fused-MoE kernel calls
``tl.dot`` on float32 tiles with Triton's default precision, and a plain float32
reference would read the difference as a systematic error of about -0.1 %. This
probe asks the GPU: one 16 x 16 x 16 ``tl.dot`` with A = diag(a) and B = I, where
each ``a`` sits at a known place between two TF32 values, and prints what came
out for each: ``truncated`` (toward zero), ``rounded`` (to nearest) or ``full``.

    python lab/gpu/probes/tf32_operands.py [--json out.json]   # stdlib, torch and Triton only

Needs a CUDA GPU and Triton; exit 2 with one line otherwise. Exit 0 either way the
answer goes: it reports, it does not gate.
"""

from __future__ import annotations

import argparse
import json
import sys

ULP = 2.0**-10  # a TF32 step at 1.0
PROBES = {
    "1 + 0.25 step": 1 + 0.25 * ULP,
    "1 + 0.75 step": 1 + 0.75 * ULP,
    "-(1 + 0.75 step)": -(1 + 0.75 * ULP),
    "1.5 + 0.625 step": 1.5 + 0.625 * ULP,
}


def classify(value: float, got: float) -> str:
    """Which reading of ``value`` as a TF32 operand produced ``got``."""
    mag = abs(value)
    step = 2.0 ** (int.bit_length(int(mag)) - 1) * ULP if mag >= 1 else ULP
    low = (mag // step) * step
    high = low + step
    sign = -1.0 if value < 0 else 1.0
    nearest = high if mag - low > high - mag else low
    if got == value:
        return "full"
    if got == sign * low and got != sign * nearest:
        return "truncated"
    if got == sign * nearest and got != sign * low:
        return "rounded"
    if got == sign * low:
        return "truncated or rounded"
    return f"other ({got!r})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError as exc:
        print(f"tf32_operands: needs torch and Triton ({exc})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("tf32_operands: needs a CUDA GPU", file=sys.stderr)
        return 2

    @triton.jit
    def dot16(a_ptr, b_ptr, c_ptr):
        i = tl.arange(0, 16)
        a = tl.load(a_ptr + i[:, None] * 16 + i[None, :])
        b = tl.load(b_ptr + i[:, None] * 16 + i[None, :])
        tl.store(c_ptr + i[:, None] * 16 + i[None, :], tl.dot(a, b))  # Triton's default input precision

    values = list(PROBES.values())
    a = torch.zeros(16, 16, dtype=torch.float32, device="cuda")
    for j, v in enumerate(values):
        a[j, j] = v
    b = torch.eye(16, dtype=torch.float32, device="cuda")
    c = torch.empty_like(a)
    dot16[(1,)](a, b, c)
    torch.cuda.synchronize()
    rows = []
    for j, (name, v) in enumerate(PROBES.items()):
        got = float(c[j, j])
        rows.append({"probe": name, "value": v, "result": got, "reading": classify(v, got)})
        print(f"{name}: {v!r} -> {got!r}: {classify(v, got)}")
    readings = {r["reading"] for r in rows}
    print(
        f"tf32_operands: torch {torch.__version__}, Triton {triton.__version__}, "
        f"{torch.cuda.get_device_name()}: {', '.join(sorted(readings))}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"triton": triton.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
