"""The host side of offloading: memory the host can pin, and the bandwidth at which the GPU reads pinned host memory
in place (a UVA view), the way vLLM's UVA offloader serves expert weights at every decode step.

- **uva**: a kernel summing host pages over the bus (the sum is checked, so a view that reads garbage fails).
  Every host-resident decode step is such a read, so this figure bounds what the A/B can gain; the H200's PCIe
  5.0 x16 read 49.7 GB/s in place (``results/gate-rehearsal-h200.md``), a PCIe 4.0 x16 card about half.
- **pinned**: vLLM's UVA offloader pins each expert weight it moves, so the need is what the legs will load
  (``moegate.preflight.needs``); checked against ``MemAvailable`` first, then by pinning it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moegate.preflight.report import GIB, Report


def mem_available_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GIB
    except (OSError, ValueError, IndexError):
        return None
    return None


def pin(torch: Any, need_gib: float) -> tuple[float, float]:
    """Pin ``need_gib`` in 1-GiB pieces and release them: (GiB pinned, seconds). Stops at the first refusal."""
    pieces = []
    pinned = 0.0
    t0 = time.perf_counter()
    try:
        while pinned < need_gib:
            size = min(1.0, need_gib - pinned)
            pieces.append(torch.empty(int(size * GIB), dtype=torch.uint8, pin_memory=True))
            pinned += size
    except RuntimeError:
        pass
    finally:
        seconds = time.perf_counter() - t0
        del pieces
    return pinned, seconds


class _HostView:
    """A CUDA view of a pinned host tensor: under unified addressing the device takes the host pointer itself."""

    def __init__(self, t: Any) -> None:
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape),
            "typestr": "<f4",
            "data": (t.data_ptr(), False),
            "version": 3,
        }


def uva_read_gbps(torch: Any, gib: float, repeats: int) -> tuple[float, list[float]]:
    """Median GB/s (1e9 bytes) of a kernel reading ``gib`` of pinned host memory in place, and every reading.

    Raises RuntimeError when the view reads wrong values (the sum of ones is checked exactly).
    """
    n = int(gib * GIB) // 4
    host = torch.ones(n, dtype=torch.float32, pin_memory=True)
    view = torch.as_tensor(_HostView(host), device="cuda")
    readings = []
    for i in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = view.sum(dtype=torch.float64)
        torch.cuda.synchronize()
        if i:  # the first read maps the pages: untimed
            readings.append(n * 4 / (time.perf_counter() - t0) / 1e9)
    if float(total) != float(n):
        raise RuntimeError(f"the UVA view read a sum of {float(total)!r}, not {n} (ones)")
    del view, host
    return statistics.median(readings), readings


def check_pinned(
    report: Report, torch: Any, need: float, why: str, out: Callable[[str], None], available: float | None = None
) -> None:
    """Can the host pin ``need`` GiB? First against ``MemAvailable`` (``available``, read here when not given), so an
    impossible request fails without touching memory; then by pinning it (``pin``)."""
    available = mem_available_gib() if available is None else available
    report.facts["pinned_need_gib"] = round(need, 3)
    if available is not None and available < need:
        report.facts["pinnable_gib"] = 0.0
        report.add(
            "pinned", "FAIL", f"{available:.1f} GiB of host memory available, the offload needs {need:.3g} ({why})", out
        )
        return
    pinned, seconds = pin(torch, need)
    report.facts["pinnable_gib"] = round(pinned, 2)
    if pinned >= need:
        report.add(
            "pinned",
            "ok",
            f"pinned {pinned:.3g} GiB in {seconds:.1f} s (the offloading tiers need {need:.3g}: {why})",
            out,
        )
    else:
        text = f"could pin only {pinned:.3g} of the {need:.3g} GiB the offloading tiers need ({why}): cudaHostAlloc refused"
        report.add("pinned", "FAIL", text, out)
