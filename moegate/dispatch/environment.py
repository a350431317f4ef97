"""The environment a run saw, for report headers and golden provenance: torch, vLLM, Triton, GPU, profile."""

from __future__ import annotations

import os

import torch


def describe_environment() -> dict[str, str]:
    """Versions for report headers and golden provenance; never raises."""
    info = {"torch": torch.__version__, "cuda": str(torch.cuda.is_available())}
    try:
        import vllm

        info["vllm"] = getattr(vllm, "__version__", "unknown")
    except Exception as exc:  # noqa: BLE001 - any import failure is reported, not raised
        info["vllm"] = f"not importable ({type(exc).__name__})"
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = "absent"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda_runtime"] = str(torch.version.cuda)
    info["hypothesis_profile"] = os.environ.get("MOEGATE_PROFILE", "dev")
    return info
