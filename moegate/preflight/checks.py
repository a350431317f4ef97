"""The preflight's checks of the GPU and the disk, each one line (the host-memory ones are ``host.py``'s).

- **driver**: the NVIDIA driver lists a GPU (``nvidia-smi``), its name and memory: no torch needed, so it can run
  before any environment is built.
- **gpu**: a CUDA device torch can use, its name and memory. A GPU the driver or torch cannot see is not a failed
  check but a runner the preflight cannot judge: ``PreflightError``, one line and exit 2.
- **gpu-memory**: free GPU memory (``torch.cuda.mem_get_info``) against what the legs need (``--leg``, summed:
  ``moegate.preflight.needs``).
- **shared**: other processes holding memory on the GPU right after the bandwidth read, as information: work beside
  the read shares the bus, and the figure is then low (two preflights at once on the H200 read 22.7 GB/s each, one
  alone 49.7: ``results/gate-rehearsal-h200.md``). NVML inside a container may not list other namespaces' pids, so an
  empty list is not proof of an idle GPU.
- **disk**: free space where the environments live (``$MOEGATE_ENV_DIR``, else ``~/.cache``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from moegate.preflight import gpu_processes as processes
from moegate.preflight.host import check_pinned, uva_read_gbps
from moegate.preflight.needs import gpu_needs
from moegate.preflight.pcie import pcie_link
from moegate.preflight.report import GIB, PreflightError, Report

Out = Callable[[str], None]


def disk_root(env: Mapping[str, str] = os.environ) -> Path:
    given = env.get("MOEGATE_ENV_DIR", "").strip()
    return Path(given).expanduser() if given else Path.home() / ".cache"


def check_disk(report: Report, path: Path, need_gib: float, out: Out) -> None:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / GIB
    report.facts["free_disk_gib"] = round(free, 1)
    if free >= need_gib:
        report.add("disk", "ok", f"{free:.1f} GiB free at {path} (need {need_gib:g})", out)
    else:
        report.add("disk", "FAIL", f"{free:.1f} GiB free at {path}, the environments need {need_gib:g} GiB", out)


def parse_smi_gpu(text: str) -> tuple[str, float]:
    """``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`` -> (first GPU's name, GiB)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    name, _, mib = first.rpartition(",")
    try:
        return name.strip(), float(mib) / 1024
    except ValueError:
        raise ValueError(f"unexpected nvidia-smi output: {first!r}") from None


def check_driver(report: Report, out: Out) -> None:
    """The NVIDIA driver lists a GPU: ``nvidia-smi``, no torch. None listed: ``PreflightError``."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise PreflightError("no GPU this runner can see: nvidia-smi is not on PATH (no NVIDIA driver)")
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        name, gib = parse_smi_gpu(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PreflightError(f"no GPU this runner can see: nvidia-smi lists no usable GPU ({why})") from None
    report.facts.setdefault("gpu", name)
    report.facts.setdefault("gpu_memory_gib", round(gib, 1))
    report.add("driver", "ok", f"{name}, {gib:.1f} GiB (nvidia-smi)", out)


def cuda_torch() -> Any:
    """torch, where it sees a CUDA device; ``PreflightError`` (one line) where it does not."""
    try:
        import torch  # the GPU checks need torch; the driver and disk checks do not
    except ImportError:
        raise PreflightError(
            "no GPU this runner can see: torch is not importable in this Python (run preflight in a vLLM environment)"
        ) from None
    if not torch.cuda.is_available():
        why = "torch.cuda.is_available() is False"
        if torch.version.cuda is None:
            why += f" (torch {torch.__version__} is a CPU build)"
        elif os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            why += f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r})"
        raise PreflightError(f"no GPU this runner can see: {why}")
    return torch


def check_gpu(report: Report, opts: argparse.Namespace, out: Out) -> None:
    """gpu, gpu-memory, uva, shared, pcie and pinned: each through torch's CUDA device."""
    torch = cuda_torch()
    props = torch.cuda.get_device_properties(0)
    mem = props.total_memory / GIB
    report.facts.update(gpu=props.name, gpu_memory_gib=round(mem, 1))
    report.add("gpu", "ok", f"{props.name}, {mem:.1f} GiB", out)
    free, total = torch.cuda.mem_get_info(0)
    check_gpu_memory(report, free / GIB, total / GIB, opts.leg, out)
    parts = [getattr(props, f"pci_{k}_id", -1) for k in ("domain", "bus", "device")]
    bus = "{:04x}:{:02x}:{:02x}.0".format(*parts) if min(parts) >= 0 else None
    try:
        gbps, readings = uva_read_gbps(torch, opts.uva_gib, opts.repeats)
        report.facts.update(uva_read_gbps=round(gbps, 2), uva_readings_gbps=[round(x, 2) for x in readings])
        report.add("uva", "ok", f"{gbps:.1f} GB/s reading pinned host memory in place ({opts.uva_gib:g} GiB)", out)
    except RuntimeError as exc:
        report.add("uva", "FAIL", f"a CUDA view of pinned host memory did not work: {exc}".splitlines()[0], out)
    check_shared(report, out)
    link, source = pcie_link(bus)
    report.facts.update(pcie_gen=link.get("gen"), pcie_width=link.get("width"), pcie_source=source)
    report.facts.update(pcie_gen_max=link.get("gen_max"), pcie_width_max=link.get("width_max"))
    if link:
        text = f"gen {link.get('gen', '?')} x{link.get('width', '?')} after the read"
        text += f" (the device's maximum: gen {link.get('gen_max', '?')} x{link.get('width_max', '?')}; from {source})"
        report.add("pcie", "info", text, out)
    else:
        report.add("pcie", "info", "link not reported (no NVML, nvidia-smi or sysfs entry)", out)
    check_pinned(report, torch, opts.need_pinned_gib, opts.pinned_why, out)


def check_gpu_memory(report: Report, free_gib: float, total_gib: float, legs: list[str], out: Out) -> None:
    """Free GPU memory against the legs' summed need (``--leg``); without a leg, the free figure as information."""
    report.facts["gpu_free_gib"] = round(free_gib, 1)
    if not legs:
        report.add("gpu-memory", "info", f"{free_gib:.1f} of {total_gib:.1f} GiB free (no --leg: no need checked)", out)
        return
    need, why = gpu_needs(legs, total_gib)
    report.facts["gpu_need_gib"] = round(need, 1)
    if free_gib >= need:
        report.add(
            "gpu-memory", "ok", f"{free_gib:.1f} of {total_gib:.1f} GiB free (the legs need {need:.1f}: {why})", out
        )
    else:
        report.add(
            "gpu-memory", "FAIL",
            f"{free_gib:.1f} of {total_gib:.1f} GiB free, the legs need {need:.1f} ({why}): other work holds the rest",
            out,
        )  # fmt: skip


def check_shared(report: Report, out: Out, own: int | None = None) -> None:
    """Other processes holding memory on the GPU right after the bandwidth read: information, not a gate."""
    held = processes.gpu_processes()
    if held is None:
        return
    me = os.getpid() if own is None else own
    others = sorted((p for p in held if p.pid != me), key=lambda p: p.pid)
    report.facts["gpu_other_processes"] = len(others)
    if others:
        shown = ", ".join(str(p.pid) for p in others[:8]) + (" ..." if len(others) > 8 else "")
        gib = sum(p.used_mib for p in others) / 1024
        report.add(
            "shared", "info",
            f"{len(others)} other process(es) hold {gib:.1f} GiB of GPU memory (pids {shown}): work beside the read"
            " shares the bus, so the uva figure may be low",
            out,
        )  # fmt: skip
