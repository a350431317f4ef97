"""What the kernel tier's tests share: where fp8 runs, and the tier's Hypothesis settings."""

from __future__ import annotations

import torch
from hypothesis import settings

from moegate.core import profiles


def _fp8_capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


FP8 = _fp8_capable()
"""fp8 tensor cores (Ada, Hopper and later): where vLLM's Triton kernel runs fp8_w8a8 weights."""
FP8_SKIP = "fp8_w8a8 needs a GPU of compute capability 8.9 or later (fp8 tensor cores)"
QUANT_FAMILY: str | None = None if FP8 else "wna16"
"""``kernel_cases(schemes=...)`` for properties that draw any quantization: fp8 only where it runs."""

kernel_settings = settings(max_examples=profiles.kernel_examples())
"""The loaded profile (``MOEGATE_PROFILE``) with its kernel-tier example count (``profiles.KERNEL_EXAMPLES``).

Every health check the profile leaves on stays on: the kernel strategies draw valid cases directly (no
filter), and the time a property spends on the GPU is not draw time, which is all ``too_slow`` measures."""
