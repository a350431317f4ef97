"""Does the GPU read host memory faster from one NUMA node than from another?

Why: the H200 A/B's starts differ by up to 40 % at one request in flight on both builds
(`results/ab-h200.md`), where a UVA-offloaded decode step is a read of host memory over PCIe.
A server's pinned expert weights land on the NUMA node whose CPUs first touch them, and
nothing in the A/B binds the server to a node (the change description's own runs use
``numactl --cpunodebind --membind`` to the GPU's node). This probe lists the nodes, the GPU's
node, and for each node this process may run on: pins 1 GiB there (first touch from that
node's CPUs), then times the GPU reading it, as a copy-engine copy to the device and as a
kernel reading the host pages in place (zero-copy, what UVA offloading does).

    python lab/gpu/probes/numa_host_reads.py [--gib 1] [--repeats 5] [--json out.json]

Needs a CUDA GPU and torch; exit 2 with one line otherwise. It reports, it does not gate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

NODES = Path("/sys/devices/system/node")


def cpulist(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11}"""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def nodes() -> dict[int, set[int]]:
    found = {}
    for d in sorted(NODES.glob("node[0-9]*")):
        found[int(d.name[4:])] = cpulist((d / "cpulist").read_text())
    return found


class _HostView:
    """A CUDA view of pinned host memory (unified addressing: the device sees the host pointer)."""

    def __init__(self, t):
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape),
            "typestr": "<f4",
            "data": (t.data_ptr(), False),
            "version": 3,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("numa_host_reads: needs torch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("numa_host_reads: needs a CUDA GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    parts: list[int] = [getattr(props, f"pci_{k}_id", -1) for k in ("domain", "bus", "device")]
    bus = "{:04x}:{:02x}:{:02x}.0".format(*parts) if min(parts) >= 0 else "unknown"
    gpu_node_file = Path("/sys/bus/pci/devices") / bus / "numa_node"
    gpu_node = int(gpu_node_file.read_text()) if gpu_node_file.is_file() else None
    allowed = os.sched_getaffinity(0)
    report: dict = {"gpu": torch.cuda.get_device_name(0), "pci_bus_id": bus, "gpu_numa_node": gpu_node}
    report["nodes"] = {n: sorted(c) for n, c in nodes().items()}
    report["allowed_cpus"] = sorted(allowed)
    n_floats = int(opts.gib * (1 << 30)) // 4
    results: dict[int, object] = {}
    for node, cpus in nodes().items():
        mine = cpus & allowed
        if not mine:
            results[node] = "no allowed CPU on this node"
            continue
        os.sched_setaffinity(0, mine)
        host = torch.empty(n_floats, dtype=torch.float32, pin_memory=True)
        host.fill_(1.0)  # first touch from this node's CPUs
        dev = torch.empty(n_floats, dtype=torch.float32, device="cuda")
        copy: list[float] = []
        zero_copy: list[float] = []
        check: bool | str
        for _ in range(opts.repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            copy.append(opts.gib * (1 << 30) / (time.perf_counter() - t0) / 1e9)
        try:
            view = torch.as_tensor(_HostView(host), device="cuda")
            for _ in range(opts.repeats):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                total = view.sum()
                torch.cuda.synchronize()
                zero_copy.append(opts.gib * (1 << 30) / (time.perf_counter() - t0) / 1e9)
            check = abs(float(total) - n_floats) <= 1e-6 * n_floats
        except Exception as exc:  # noqa: BLE001 - the copy figure stands alone if the view is refused
            check = f"zero-copy view refused: {type(exc).__name__}: {exc}".splitlines()[0]
        results[node] = {
            "cpus_used": len(mine),
            "copy_gbps": [round(x, 2) for x in copy],
            "zero_copy_gbps": [round(x, 2) for x in zero_copy],
            "zero_copy_sum_ok": check,
        }
        del host, dev
        torch.cuda.empty_cache()
        os.sched_setaffinity(0, allowed)
    report["per_node"] = results
    text = json.dumps(report, indent=1)
    print(text)
    if opts.json:
        opts.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
