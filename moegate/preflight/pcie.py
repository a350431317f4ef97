"""The PCIe link as the driver reports it: NVML (``nvidia-ml-py``, vLLM's own dependency), else ``nvidia-smi``,
else the PCI device's sysfs files. Read after the bandwidth measurement: an idle link trains down to generation 1
to save power, so a reading taken cold says nothing about the link under load."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# sysfs names the link speed in GT/s; each PCIe generation doubles it (gen 3 from 8 on, with 128b/130b coding)
GT_PER_S_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


def gen_from_speed(text: str) -> int | None:
    """The PCIe generation of a sysfs link speed (``'32.0 GT/s PCIe'`` -> 5); None when unknown."""
    try:
        rate = float(text.split()[0])
    except (IndexError, ValueError):
        return None
    return GT_PER_S_TO_GEN.get(rate)


def parse_nvidia_smi(text: str) -> dict[str, int]:
    """``nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,
    pcie.link.width.max --format=csv,noheader,nounits`` for the first GPU -> its four integers."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    parts = [p.strip() for p in first.split(",")]
    keys = ("gen", "gen_max", "width", "width_max")
    if len(parts) != len(keys) or not all(p.isdigit() for p in parts):
        raise ValueError(f"unexpected nvidia-smi output: {first!r}")
    return dict(zip(keys, map(int, parts), strict=True))


def pcie_link(bus_id: str | None) -> tuple[dict[str, int], str]:
    """The link's current and maximum generation and width, and where the figures came from."""
    try:
        import pynvml  # nvidia-ml-py: vLLM's own dependency, optional here

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            link = {
                "gen": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                "gen_max": pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                "width": pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
                "width_max": pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
            }
            return link, "NVML"
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - no NVML binding or no driver: the next source answers
        del exc
    smi = shutil.which("nvidia-smi")
    if smi:
        query = "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
        try:
            done = subprocess.run(
                [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            return parse_nvidia_smi(done.stdout), "nvidia-smi"
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    if bus_id:
        dev = Path("/sys/bus/pci/devices") / bus_id.lower()
        try:
            link = {
                "gen": gen_from_speed((dev / "current_link_speed").read_text()),
                "gen_max": gen_from_speed((dev / "max_link_speed").read_text()),
                "width": int((dev / "current_link_width").read_text()),
                "width_max": int((dev / "max_link_width").read_text()),
            }
            return {k: v for k, v in link.items() if v is not None}, "sysfs"
        except (OSError, ValueError):
            pass
    return {}, "none"
