"""Where a loaded model's weights really are: every parameter's marker, bytes and the driver's word on its memory.

``observe(model, segments)`` runs inside vLLM's worker (through ``LLM.apply_model``) after the
loader has offloaded and post-processed the weights, and returns plain data for
``moegate.offload.verdict`` to judge:

- per parameter, in registration order: its name, the UVA marker, its bytes, dtype and shape,
  the driver's memory type and allocation range for its data pointer (``moegate.offload.pointers``),
  whether that pointer lies in torch's CUDA allocator segments, and whether vLLM's
  ``cpu_offload_params`` rule selects it (a whole-segment match of the name inside a decoder layer);
- vLLM's offloader: its class, the bytes it says it moved to the host and its budget;
- torch's pinned-host allocator statistics, where this torch has them.

``calibrate_pinned`` measures, in the same process, how torch's pinned allocator rounds a
request: the allocation the driver reports for a few request sizes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from moegate.dispatch.names import UVA_MARKER
from moegate.offload import pointers

DECODER_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
CALIBRATION_SIZES = (1, 1000, 4097, (1 << 20) + 1, 3 << 20)
"""Pinned request sizes for the rounding measurement: below a page, just above one, just above 1 MiB, 3 MiB."""


def layer_of(name: str) -> int | None:
    m = DECODER_LAYER.search(name)
    return int(m.group(1)) if m else None


def selected(name: str, segments: Iterable[str]) -> bool:
    """vLLM's ``cpu_offload_params`` rule: some entry matches whole name segments, inside a decoder layer.

    The offloader wraps the decoder layers only and matches ``.entry.`` inside ``.name.``;
    an empty selection means every parameter of every layer is eligible.
    """
    m = DECODER_LAYER.search(name)
    if m is None:
        return False
    inside = name[m.end() :]  # the name the offloader matches: relative to the decoder layer
    segs = list(segments)
    return not segs or any(f".{s}." in f".{inside}." for s in segs)


def _offloader() -> dict[str, Any]:
    try:
        from vllm.model_executor.offloader.base import get_offloader
    except ImportError:
        return {"class": None}
    off = get_offloader()
    return {
        "class": type(off).__name__,
        "cpu_offload_bytes": getattr(off, "cpu_offload_bytes", None),
        "cpu_offload_max_bytes": getattr(off, "cpu_offload_max_bytes", None),
        "uva_offloading": getattr(off, "uva_offloading", None),
        "pin_memory": getattr(off, "pin_memory", None),
        "segments": sorted(getattr(off, "cpu_offload_params", None) or []),
    }


def _host_stats() -> dict[str, Any] | None:
    import torch

    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None:
        return None
    try:
        return {k: v for k, v in stats().items() if k.endswith((".current", ".peak"))}
    except RuntimeError:
        return None


def observe(model: Any, segments: Iterable[str]) -> dict[str, Any]:
    """Every parameter of ``model`` with the driver's word on its memory; plain data (see the module docstring)."""
    pointers.ensure_context()
    segs = sorted(segments)
    named = list(model.named_parameters())
    ptrs = [p.data_ptr() for _, p in named]
    torch_segments = pointers.in_torch_segments(ptrs)
    params = []
    for (name, p), ptr, in_torch in zip(named, ptrs, torch_segments):
        info = pointers.where(ptr) if p.numel() else pointers.PointerInfo("empty", None, 0, 0)
        params.append(
            {
                "name": name,
                "layer": layer_of(name),
                "selected": selected(name, segs),
                "marked": bool(getattr(p, UVA_MARKER, False)),
                "nbytes": p.numel() * p.element_size(),
                "dtype": str(p.dtype).removeprefix("torch."),
                "shape": list(p.shape),
                "torch_device": str(p.device),
                "ptr": ptr,
                "memory": info.memory,
                "gpu": info.device,
                "range_start": info.range_start,
                "range_size": info.range_size,
                "in_torch_segments": in_torch,
            }
        )
    return {"segments": segs, "params": params, "offloader": _offloader(), "host_allocator": _host_stats()}


def calibrate_pinned(_model: Any = None) -> list[dict[str, Any]]:
    """For each of ``CALIBRATION_SIZES``: the allocation the driver reports behind a fresh pinned tensor of that size.

    Run after ``observe``: the tensors go back to torch's pinned cache, where later
    same-size requests could reuse them, so they must not precede what is measured.
    """
    import torch

    pointers.ensure_context()
    out: list[dict[str, Any]] = []
    keep = []
    for n in CALIBRATION_SIZES:
        t = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        keep.append(t)  # alive until all are measured: no block is reused among them
        info = pointers.where(t.data_ptr())
        out.append({"request": n, "memory": info.memory, "range_size": info.range_size})
    return out
