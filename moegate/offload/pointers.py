"""Where a pointer points, in the CUDA driver's own words: host or device memory, and the allocation around it.

A tensor vLLM calls host-resident is a CUDA view of pinned host memory (UVA): its ``device``
says ``cuda`` whatever backs it, so only the driver can tell. ``where(ptr)`` asks
``cuPointerGetAttribute`` (the driver API in ``libcuda.so.1``, which every CUDA build of torch
loads) for the memory type, the device ordinal and the allocation's range:

- ``host``: page-locked host memory mapped for the GPU (``cudaHostAlloc``, ``cudaHostRegister``);
- ``device``: device memory (``cudaMalloc`` and the caching allocator on top of it);
- ``unregistered``: memory CUDA does not know (pageable host memory): a kernel must not read it;
- ``array`` / ``unified``: the driver's other answers, reported as they come.

The calling thread needs a current CUDA context (``ensure_context``): torch makes its device's
primary context current on first use.
"""

from __future__ import annotations

import ctypes
import dataclasses
from functools import cache

CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
MEMORY_TYPES = {1: "host", 2: "device", 3: "array", 4: "unified"}
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1  # the pointer is not one CUDA allocated or registered


class DriverError(RuntimeError):
    """The driver could not be asked (no libcuda, an error other than "unknown pointer")."""


@dataclasses.dataclass(frozen=True)
class PointerInfo:
    """The driver's answer for one pointer."""

    memory: str  # host | device | unregistered | array | unified
    device: int | None  # the GPU ordinal the memory belongs to (device memory), else None
    range_start: int  # the allocation containing the pointer: first byte
    range_size: int  # ... and its size in bytes (0 when the driver does not know the pointer)


@cache
def _driver() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise DriverError(f"cannot load the CUDA driver (libcuda.so.1): {exc}") from None
    lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    lib.cuPointerGetAttribute.restype = ctypes.c_int
    return lib


def _attribute(ptr: int, attribute: int, out: ctypes._SimpleCData) -> int:
    return int(_driver().cuPointerGetAttribute(ctypes.byref(out), attribute, ctypes.c_uint64(ptr)))


def where(ptr: int) -> PointerInfo:
    """The driver's memory type, device and allocation range for ``ptr``."""
    kind = ctypes.c_uint(0)
    rc = _attribute(ptr, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, kind)
    if rc == CUDA_ERROR_INVALID_VALUE:
        return PointerInfo("unregistered", None, 0, 0)
    if rc != CUDA_SUCCESS:
        raise DriverError(f"cuPointerGetAttribute(MEMORY_TYPE, {ptr:#x}) returned CUresult {rc}")
    memory = MEMORY_TYPES.get(kind.value, f"type-{kind.value}")
    ordinal = ctypes.c_int(-1)
    device = None
    if memory == "device" and _attribute(ptr, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ordinal) == CUDA_SUCCESS:
        device = ordinal.value
    start, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    if _attribute(ptr, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, start) != CUDA_SUCCESS:
        start = ctypes.c_uint64(0)
    if _attribute(ptr, CU_POINTER_ATTRIBUTE_RANGE_SIZE, size) != CUDA_SUCCESS:
        size = ctypes.c_size_t(0)
    return PointerInfo(memory, device, int(start.value), int(size.value))


def ensure_context() -> None:
    """Make torch's current device's primary context current on this thread (the driver query needs one)."""
    import torch

    torch.cuda.init()
    torch.cuda.set_device(torch.cuda.current_device())
    torch.cuda.synchronize()


def in_torch_segments(ptrs: list[int]) -> list[bool]:
    """For each pointer: does it lie inside a segment of torch's CUDA caching allocator (a second witness for device)?"""
    import torch

    segments = [(s["address"], s["address"] + s["total_size"]) for s in torch.cuda.memory_snapshot()]
    return [any(lo <= p < hi for lo, hi in segments) for p in ptrs]
