"""Runner preflight: can this machine run the GPU tiers, and what does it measure?

    moegate preflight [--json FILE] [--checks driver,gpu,disk] [--model DIR]... [--need-pinned-gib G]
                      [--need-disk-gib G] [--disk-path DIR] [--uva-gib G]

The first step of every GPU leg (``tooling/ci/gpu_leg.py preflight``; ``--checks driver,disk`` before the leg's
environments are built, with any Python: no torch needed). Each check prints one line (``ok``, ``FAIL`` or ``info``) and the run
exits 0 only when every check passed; a failing check's line names the cause. ``--json`` writes the whole
report (the contract the A/B reads: ``uva_read_gbps`` feeds its evidence columns instead of a constant).

What it checks and measures, and why:

- **driver**: the NVIDIA driver lists a GPU (``nvidia-smi``), its name and memory: no torch needed, so it can run
  before any environment is built. Not a default check: ``gpu`` below says the same through torch.
- **gpu**: a CUDA device torch can use, its name and memory. Without one no GPU tier runs.
- **pcie**: the link generation and width as the driver reports them (NVML through ``nvidia-ml-py``, else
  ``nvidia-smi``, else the PCI device's sysfs files), read *after* the bandwidth measurement: an idle link
  trains down to generation 1 to save power, so a reading taken cold says nothing about the link under load.
  It is information, not a gate: the bandwidth below is the figure that matters.
- **uva**: the read bandwidth of a CUDA view of pinned host memory, the way UVA offloading reads expert
  weights in place (a kernel summing host pages over the bus; the sum is checked, so a view that reads
  garbage fails). Every host-resident decode step is such a read, so this figure bounds what the A/B can
  gain; the H200's PCIe 5.0 x16 read 51 GB/s in place (``/work/shared/DESIGN.md``), a PCIe 4.0 x16 card about half.
  The median of ``--repeats`` reads of ``--uva-gib`` GiB, after one untimed read.
- **pinned**: that the host can pin what the offloading tiers will pin. vLLM's UVA offloader pins each
  expert weight it moves (up to ``--cpu-offload-gb``, but never more than the model's experts), so the need is
  the largest model's expert bytes: the A/B's wide model holds 4 layers x 128 experts x 3 x 2048 x 768
  bf16 = 4.83 GB = 4.5 GiB of experts; pinned allocations round each one up, and two servers of a pair may
  overlap at a hand-over, hence the default of 8 GiB. ``--model DIR`` (repeatable) makes the need follow what the
  legs will load instead: twice each model's expert bytes (a pair's two servers hold theirs at once; the e2e tier
  serves both builds together, the A/B hands over), read from its ``config.json``; ``--need-pinned-gib`` is added to
  that (a kernel leg's own pinned weights beside the e2e legs). Checked by pinning it (1-GiB pieces, released at
  once), after comparing with ``MemAvailable`` so that an impossible request fails without touching memory.
- **shared**: other processes holding memory on the GPU right after the read (nvidia-smi's compute apps), as
  information: work beside the read shares the bus, and the figure above is then low (two preflights at once
  on the H200 read 22.7 GB/s each, one alone 49.7).
- **disk**: free space where the environments live (``$MOEGATE_ENV_DIR``, else ``~/.cache``): two vLLM
  environments of about 9.4 GB each (``results/environments.md``), the models and the runs' files: 30 GiB.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from moegate.ab.evidence import MoEShape
from moegate.serve.server import gpu_pids

DEFAULT_PINNED_GIB = 8.0
DEFAULT_DISK_GIB = 30.0
CHECKS = ("driver", "gpu", "disk")
GIB = 1 << 30
# sysfs names the link speed in GT/s; each PCIe generation doubles it (gen 3 from 8 on, with 128b/130b coding)
GT_PER_S_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


class PreflightError(Exception):
    """Bad input to preflight itself (not a failed check)."""


@dataclasses.dataclass
class Check:
    name: str
    status: str  # "ok", "FAIL" or "info"
    text: str

    def line(self) -> str:
        return f"{self.status:<4} {self.name}: {self.text}"


@dataclasses.dataclass
class Report:
    checks: list[Check] = dataclasses.field(default_factory=list)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.status != "FAIL" for c in self.checks)

    def add(self, name: str, status: str, text: str, out: Callable[[str], None] = print) -> None:
        check = Check(name, status, text)
        self.checks.append(check)
        out(check.line())

    def to_json(self) -> dict[str, Any]:
        keys = ("gpu", "gpu_memory_gib", "pcie_gen", "pcie_width", "uva_read_gbps", "pinnable_gib", "free_disk_gib")
        body: dict[str, Any] = {k: self.facts.get(k) for k in keys}
        body.update({k: v for k, v in self.facts.items() if k not in body})
        body["ok"] = self.ok
        body["checks"] = [dataclasses.asdict(c) for c in self.checks]
        return body


# --- PCIe: the driver's word -------------------------------------------------------------------


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


# --- host memory ---------------------------------------------------------------------------------


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


# --- the checks ----------------------------------------------------------------------------------


def disk_root(env: Mapping[str, str] = os.environ) -> Path:
    given = env.get("MOEGATE_ENV_DIR", "").strip()
    return Path(given).expanduser() if given else Path.home() / ".cache"


def check_disk(report: Report, path: Path, need_gib: float, out: Callable[[str], None]) -> None:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / GIB
    report.facts["free_disk_gib"] = round(free, 1)
    if free >= need_gib:
        report.add("disk", "ok", f"{free:.1f} GiB free at {path} (need {need_gib:g})", out)
    else:
        report.add("disk", "FAIL", f"{free:.1f} GiB free at {path}, the environments need {need_gib:g} GiB", out)


def model_pinned_gib(model: str | Path) -> float:
    """Twice the expert bytes of ``model`` (a folder with a Qwen3-MoE-like ``config.json``), in GiB; PreflightError."""
    shape = MoEShape.from_config(model)
    if shape is None:
        raise PreflightError(
            f"--model {model}: no MoE config.json there (num_experts, hidden_size, moe_intermediate_size)"
        )
    return 2 * shape.layers * shape.experts * shape.expert_bytes / GIB


def pinned_need(models: Sequence[str | Path], given: float | None) -> tuple[float, str]:
    """The pinned host memory the legs need (GiB) and how it was reckoned: ``--model``s and ``--need-pinned-gib``."""
    if not models:
        need = DEFAULT_PINNED_GIB if given is None else given
        return need, "given" if given is not None else "the default: the A/B's wide model, two servers"
    parts = [(Path(m).name, model_pinned_gib(m)) for m in models]
    need = sum(g for _, g in parts) + (given or 0.0)
    why = " + ".join(f"2 x {name}'s experts ({g:.3f})" for name, g in parts)
    return need, why + (f" + {given:g} given" if given else "")


def parse_smi_gpu(text: str) -> tuple[str, float]:
    """``nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits`` -> (first GPU's name, GiB)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    name, _, mib = first.rpartition(",")
    try:
        return name.strip(), float(mib) / 1024
    except ValueError:
        raise ValueError(f"unexpected nvidia-smi output: {first!r}") from None


def check_driver(report: Report, out: Callable[[str], None]) -> None:
    """The NVIDIA driver lists a GPU: ``nvidia-smi``, no torch."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        report.add("driver", "FAIL", "no NVIDIA driver here: nvidia-smi is not on PATH, so no GPU tier can run", out)
        return
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        name, gib = parse_smi_gpu(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        report.add("driver", "FAIL", f"nvidia-smi lists no usable GPU ({why})", out)
        return
    report.facts.setdefault("gpu", name)
    report.facts.setdefault("gpu_memory_gib", round(gib, 1))
    report.add("driver", "ok", f"{name}, {gib:.1f} GiB (nvidia-smi)", out)


def check_gpu(report: Report, opts: argparse.Namespace, out: Callable[[str], None]) -> None:
    """gpu, uva, pcie and pinned: each needs torch with a CUDA device, so one failure there fails them all."""
    try:
        import torch  # the GPU checks need torch; the disk check does not
    except ImportError:
        for name in ("gpu", "uva", "pinned"):
            report.add(
                name, "FAIL", "torch is not importable in this Python (run preflight in a vLLM environment)", out
            )
        return
    if not torch.cuda.is_available():
        why = "no CUDA GPU: torch.cuda.is_available() is False"
        if torch.version.cuda is None:
            why += f" (torch {torch.__version__} is a CPU build)"
        for name in ("gpu", "uva", "pinned"):
            report.add(name, "FAIL", why if name == "gpu" else "needs a CUDA GPU", out)
        return
    props = torch.cuda.get_device_properties(0)
    mem = props.total_memory / GIB
    report.facts.update(gpu=props.name, gpu_memory_gib=round(mem, 1))
    report.add("gpu", "ok", f"{props.name}, {mem:.1f} GiB", out)
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


def check_shared(report: Report, out: Callable[[str], None], own: int | None = None) -> None:
    """Other processes holding memory on the GPU right after the bandwidth read: information, not a gate.

    Work beside the read shares the bus: on the H200 rehearsal of 2026-12-02 two preflights reading at once
    measured 22.7 GB/s where one alone measured 49.7 (``results/gate-rehearsal-h200.md``), and the A/B takes
    this figure for its evidence columns. nvidia-smi inside a container may not see other namespaces' pids, so
    an empty list is not proof of an idle GPU."""
    held = gpu_pids()
    if held is None:
        return
    others = sorted(held - {os.getpid() if own is None else own})
    report.facts["gpu_other_processes"] = len(others)
    if others:
        shown = ", ".join(map(str, others[:8])) + (" ..." if len(others) > 8 else "")
        report.add(
            "shared", "info",
            f"{len(others)} other process(es) hold GPU memory (pids {shown}): work beside the read shares the bus,"
            " so the uva figure may be low",
            out,
        )  # fmt: skip


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


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="moegate preflight", description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the report here (the A/B's --preflight reads it)")
    ap.add_argument("--checks", default="gpu,disk", help="comma list of driver, gpu, disk (default gpu,disk)")
    ap.add_argument("--model", action="append", default=[], help="a model the legs serve (repeat): the pinned need")
    ap.add_argument(
        "--need-pinned-gib",
        type=float,
        help=f"pinned GiB the legs need (default {DEFAULT_PINNED_GIB:g}; added to --model's)",
    )
    ap.add_argument("--need-disk-gib", type=float, default=DEFAULT_DISK_GIB)
    ap.add_argument("--disk-path", type=Path, help="where the environments go (default: $MOEGATE_ENV_DIR or ~/.cache)")
    ap.add_argument("--uva-gib", type=float, default=1.0, help="GiB read per bandwidth measurement")
    ap.add_argument("--repeats", type=int, default=5)
    return ap


def run(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> tuple[Report, argparse.Namespace]:
    """Every check, each printed through ``out`` as it completes; the report and the parsed options."""
    opts = parser().parse_args(argv)
    for name in ("need_pinned_gib", "need_disk_gib", "uva_gib"):
        value = getattr(opts, name)
        if value is not None and (value < 0 or (name == "uva_gib" and value == 0)):
            raise PreflightError(f"--{name.replace('_', '-')} must be positive, not {value}")
    if opts.repeats < 1:
        raise PreflightError(f"--repeats must be at least 1, not {opts.repeats}")
    checks = [c.strip() for c in opts.checks.split(",") if c.strip()]
    unknown = [c for c in checks if c not in CHECKS]
    if unknown or not checks:
        raise PreflightError(f"--checks {opts.checks!r}: choose from {', '.join(CHECKS)}")
    opts.need_pinned_gib, opts.pinned_why = pinned_need(opts.model, opts.need_pinned_gib)
    report = Report()
    if "driver" in checks:
        check_driver(report, out)
    if "gpu" in checks:
        check_gpu(report, opts, out)
    if "disk" in checks:
        check_disk(report, opts.disk_path or disk_root(), opts.need_disk_gib, out)
    return report, opts


def main(argv: Sequence[str] | None = None) -> int:
    try:
        report, opts = run(argv)
    except PreflightError as exc:
        print(f"moegate preflight: {exc}", file=sys.stderr)
        return 2
    if opts.json:
        tmp = opts.json.with_name(opts.json.name + ".tmp")
        tmp.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(opts.json)  # whole or not at all
    failed = [c.name for c in report.checks if c.status == "FAIL"]
    print(f"preflight: {'PASS' if not failed else 'FAIL (' + ', '.join(failed) + ')'}")
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
