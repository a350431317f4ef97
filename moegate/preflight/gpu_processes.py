"""Which processes hold memory on this GPU, and which of them are not the tier's own: the one question the
runner-fault verdict asks of NVML (``moegate.core.faults``), and a watch that asks it while a tier runs.

``gpu_processes()`` asks NVML through ``nvidia-ml-py`` (``pynvml``: vLLM's own dependency, so a build's Python has
it), else ``nvidia-smi --query-compute-apps``; None where neither answers (no driver). Only the GPUs the tier can
see count: those ``CUDA_VISIBLE_DEVICES`` names (indices or ``GPU-`` UUIDs), else every GPU.

A process is the tier's own when its environment carries the attempt's token (``MOEGATE_ATTEMPT``, set in the
tier's environment and inherited by everything it starts: pytest, vLLM's engine cores, the e2e servers, also those
in a session of their own), or when it descends from this process. Another job's process is neither. NVML in a
container lists host pids, which ``/proc`` there does not show, the attempt's own among them: such a pid counts as
another's only when it was listed before the attempt started; one that appears during the attempt is not claimed.

``Watch`` asks every ``interval_s`` seconds during the attempt, in a thread, and keeps each other process with
the most memory it was seen holding: an out-of-memory error at one moment and a neighbour gone by the time the
tier exits would otherwise look like a GPU that was the build's alone.

NVML in a container may list no process at all (its pid namespace hides the others), while the device's used memory
still counts them. So before the attempt starts, ``unlisted_mib`` asks how much of the GPU's memory is in use beyond
what the listed processes hold: the attempt has not started, so none of it is the attempt's, and above
``DRIVER_RESERVE_MIB`` (what the driver itself keeps) it is another's, shown as ``GpuProcess(0, ...)``. Memory a
hidden neighbour takes *during* the attempt cannot be told from the attempt's own, and is not claimed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from moegate.core.faults import GpuProcess

TOKEN_VARIABLE = "MOEGATE_ATTEMPT"
DRIVER_RESERVE_MIB = 1024.0
"""Used memory an idle GPU reports with no process on it: the driver's own reserve (about 0.5 GiB on an H100 with a
recent driver), rounded up."""
Reader = Callable[[], list[GpuProcess] | None]
Unlisted = Callable[[], float | None]


def _visible(environ: Mapping[str, str]) -> list[str] | None:
    given = environ.get("CUDA_VISIBLE_DEVICES")
    if given is None or not given.strip():
        return None
    return [d.strip() for d in given.split(",") if d.strip()]


def parse_compute_apps(text: str, visible: list[str] | None = None, uuids: list[str] | None = None) -> list[GpuProcess]:
    """``nvidia-smi --query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits`` -> its processes
    on the visible GPUs (``visible``: indices or UUIDs; ``uuids``: every GPU's UUID by index, to map indices)."""
    wanted = None
    if visible is not None:
        wanted = {uuids[int(v)] for v in visible if v.isdigit() and uuids and int(v) < len(uuids)}
        wanted |= {v for v in visible if v.startswith("GPU-")}
    out = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        if wanted is not None and len(parts) > 2 and parts[2] not in wanted:
            continue
        try:
            used = float(parts[1])
        except ValueError:
            used = 0.0  # "[N/A]": a process the driver does not account (MIG, some containers)
        out.append(GpuProcess(int(parts[0]), used))
    return out


def _nvml(visible: list[str] | None) -> list[GpuProcess] | None:
    try:
        import pynvml  # nvidia-ml-py: vLLM's dependency, optional here
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, or the library cannot talk to it: the next source answers
        return None
    try:
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if visible is not None and str(i) not in visible and uuid not in visible:
                continue
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else 0  # None: not accounted
                found.append(GpuProcess(int(p.pid), used / 2**20))
        return found
    except Exception:  # noqa: BLE001 - an NVML error mid-query: no answer rather than a wrong one
        return None
    finally:
        pynvml.nvmlShutdown()


def _smi(visible: list[str] | None) -> list[GpuProcess] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None

    def ask(*args: str) -> str | None:
        try:
            done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    apps = ask("--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits")
    if apps is None:
        return None
    uuids = None
    if visible is not None:
        listed = ask("--query-gpu=uuid", "--format=csv,noheader,nounits")
        uuids = [u.strip() for u in (listed or "").splitlines() if u.strip()]
    return parse_compute_apps(apps, visible, uuids)


def gpu_processes(environ: Mapping[str, str] = os.environ) -> list[GpuProcess] | None:
    """Every process holding memory on the GPUs the tier can see (NVML, else nvidia-smi); None where neither answers."""
    visible = _visible(environ)
    found = _nvml(visible)
    return found if found is not None else _smi(visible)


def _device_used_mib(visible: list[str] | None) -> float | None:
    try:
        import pynvml  # nvidia-ml-py: vLLM's dependency, optional here

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no binding or no driver: nvidia-smi answers
        return _smi_used_mib(visible)
    try:
        used = 0.0
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            if visible is None or str(i) in visible or uuid in visible:
                used += pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        return used
    except Exception:  # noqa: BLE001 - an NVML error mid-query: no answer
        return None
    finally:
        pynvml.nvmlShutdown()


def _smi_used_mib(visible: list[str] | None) -> float | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=index,uuid,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        rows = [[p.strip() for p in line.split(",")] for line in done.stdout.strip().splitlines()]
        return sum(float(r[2]) for r in rows if visible is None or r[0] in visible or r[1] in visible)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def unlisted_mib(environ: Mapping[str, str] = os.environ) -> float | None:
    """The GPUs' used memory beyond what NVML's listed processes hold (MiB), or None where neither NVML nor
    nvidia-smi answers: memory held by processes NVML does not list (another container's), plus the driver's own."""
    visible = _visible(environ)
    used = _device_used_mib(visible)
    listed = gpu_processes(environ)
    if used is None or listed is None:
        return None
    return max(0.0, used - sum(p.used_mib for p in listed))


def _environ_has(pid: int, entry: bytes, proc: Path) -> bool | None:
    try:
        return entry in (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None


def _descends_from(pid: int, ancestor: int, proc: Path) -> bool:
    seen = set()
    while pid > 1 and pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        try:
            stat = (proc / str(pid) / "stat").read_text()
            pid = int(stat.rpartition(")")[2].split()[1])  # the field after the state: the parent's pid
        except (OSError, ValueError, IndexError):
            return False
    return False


def is_own(pid: int, token: str | None, *, ancestor: int | None = None, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` is the attempt's own: its environment carries ``token`` (when given), or it descends from
    ``ancestor`` (this process by default)."""
    if token and _environ_has(pid, f"{TOKEN_VARIABLE}={token}".encode(), proc):
        return True
    return _descends_from(pid, os.getpid() if ancestor is None else ancestor, proc)


class Watch:
    """The other processes on the GPU while a tier runs: ``with Watch(token) as w: ...``, then ``w.others()``."""

    def __init__(
        self,
        token: str,
        reader: Reader = gpu_processes,
        interval_s: float = 2.0,
        unlisted: Unlisted | None = None,
        proc: Path = Path("/proc"),
    ) -> None:
        self.token, self.reader, self.interval_s, self.unlisted, self.proc = token, reader, interval_s, unlisted, proc
        self.answered = False
        self._before: set[int] = set()
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="moegate-gpu-watch", daemon=True)

    def _other(self, pid: int) -> bool:
        """Listed before the attempt started, or a process this one can see that is not the attempt's own. A pid
        that appears during the attempt and that ``/proc`` does not show is not claimed: NVML in a container lists
        host pids, the attempt's own among them."""
        if pid in self._before:
            return True
        return (self.proc / str(pid)).exists() and not is_own(pid, self.token, proc=self.proc)

    def sample(self) -> None:
        found = self.reader()
        if found is None:
            return
        self.answered = True
        for p in found:
            if self._other(p.pid):
                self._seen[p.pid] = max(self._seen.get(p.pid, 0.0), p.used_mib)

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Self:
        # the attempt has not started: what holds memory now is not its own (this process aside, and its children)
        listed = self.reader()
        self._before = {p.pid for p in listed or () if not is_own(p.pid, None, proc=self.proc)}
        hidden = self.unlisted() if self.unlisted is not None else None
        if hidden is not None and hidden > DRIVER_RESERVE_MIB:
            self.answered = True
            self._seen[0] = hidden - DRIVER_RESERVE_MIB
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()  # right after the tier: what held memory when it ended

    def others(self) -> tuple[GpuProcess, ...] | None:
        """Each other process seen, with the most memory it held; None when NVML never answered."""
        if not self.answered:
            return None
        return tuple(GpuProcess(pid, mib) for pid, mib in sorted(self._seen.items()))
