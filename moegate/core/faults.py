"""A runner's fault told apart from the build's: the verdict of one failed attempt, as ordered clauses.

A tier that fails on a GPU runner failed for one of two reasons: the build under test is wrong (a test's
assertion, a kernel that faults, an allocation the build makes that no GPU of this size could hold), or the runner
could not run it (another job's memory on the GPU, a driver or hardware error, a runner that went away). The first is
**FAIL**; the second is **RUNNER FAULT**, retried once by ``moegate gate`` and the GPU legs, and never a PASS.

``classify`` asks the clauses below in this order; the first that answers gives the verdict and its cause, so the
cause is stable and reviewable (as ``moegate/core/spec.py`` decides a path):

1. exit 0: **PASS**.
2. a hardware or driver Xid in the output (48, 61-64, 74, 79, 92, 94, 95, 119, 120, 140: ECC, the GPU's own
   micro-controller, NVLink, "fallen off the bus", GSP): **RUNNER FAULT**. The kernel's own faults also raise
   Xids (13, 31, 43: an illegal address in the build's kernel), and those are left to the next clause.
3. a fault of a kernel (an illegal or misaligned address, an illegal instruction, a device-side assert, an
   unspecified launch failure): **FAIL**. A pull request's kernel that reads out of bounds fails exactly so; a
   runner is not blamed for it unless the driver said otherwise above.
4. a driver that cannot run work (its version too old for the build's CUDA, no device, the device busy or
   unavailable, an uncorrectable ECC error, a GPU that is lost, NVML that cannot talk to the driver):
   **RUNNER FAULT**.
5. a runner that went away: the attempt killed by SIGKILL, SIGTERM or SIGHUP (the kernel's OOM killer, a runner's
   shutdown, a cancelled job), or the runner's own words for it: **RUNNER FAULT**.
6. a failure that is not out of memory (a test's assertion: a planted bug, a real one): **FAIL**, naming it. With
   an out-of-memory error elsewhere in the same run the assertion still stands: it did not run out of memory.
7. out of memory (CUDA's or vLLM's start-up check) where no process list could be read: **FAIL**: a runner fault
   is claimed only where NVML shows whose memory it was.
8. out of memory with no other process on the GPU during the attempt: **FAIL**, the build's own.
9. out of memory where torch says how much was asked, and that is more than the GPU had free plus everything
   the other processes held: **FAIL**: it would not have fit had the GPU been the build's alone.
10. out of memory while other processes held memory on the GPU: **RUNNER FAULT**, naming them.

Pure: the caller reads the output, the failing tests (the JUnit report) and the other processes
(``moegate.preflight.gpu_processes``) and hands them in.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

PASS = "PASS"
FAIL = "FAIL"
RUNNER_FAULT = "RUNNER FAULT"
EXIT_STATUS = {PASS: 0, FAIL: 1, RUNNER_FAULT: 3}
"""The exit status of each verdict (2 stays bad input): a runner fault is never read as a pass, nor as a FAIL."""

HARDWARE_XIDS = {
    48: "double-bit ECC error",
    61: "the GPU's micro-controller stopped at a breakpoint",
    62: "the GPU's micro-controller halted",
    63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "the GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
"""NVIDIA's Xid codes that the driver or the hardware raise by themselves (NVIDIA's Xid catalog)."""

_XID = re.compile(r"\bXid\b(?: *\([^)\n]*\))?:? *(\d+)", re.IGNORECASE)
KERNEL_FAULTS = (
    "an illegal memory access was encountered",
    "misaligned address",
    "an illegal instruction was encountered",
    "device-side assert triggered",
    "unspecified launch failure",
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_LAUNCH_FAILED",
)
DRIVER_ERRORS = (
    "CUDA driver version is insufficient",
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    "Driver/library version mismatch",
    "system has unsupported display driver / cuda driver combination",
    "no CUDA-capable device is detected",
    "CUDA_ERROR_NO_DEVICE",
    "busy or unavailable",
    "CUDA_ERROR_DEVICE_UNAVAILABLE",
    "uncorrectable ECC error encountered",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "GPU is lost",
    "fallen off the bus",
    "CUDA_ERROR_SYSTEM_NOT_READY",
    "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    "CUDA_ERROR_STUB_LIBRARY",
    "Failed to initialize NVML",
)
LOST_RUNNER = (
    "The runner has received a shutdown signal",
    "lost communication with the server",
    "The hosted runner lost communication",
)
RUNNER_SIGNALS: dict[int, str] = {signal.SIGKILL: "SIGKILL", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
OUT_OF_MEMORY = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation"
    r"|is less than desired GPU memory utilization|is less than the engine's budget"
    r"|No available memory for the cache blocks|Error in memory profiling"
)
_TRIED = re.compile(r"Tried to allocate ([\d.]+) ?(B|KiB|MiB|GiB|TiB)")
_FREE = re.compile(r"of which ([\d.]+) ?(B|KiB|MiB|GiB|TiB) is free")
_UNITS = {"B": 1 / 2**20, "KiB": 1 / 2**10, "MiB": 1.0, "GiB": 2.0**10, "TiB": 2.0**20}


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on the GPU, as NVML lists it; pid 0: memory in use before the attempt started that
    NVML lists under no process (another container's, ``moegate.preflight.gpu_processes``)."""

    pid: int
    used_mib: float

    def __str__(self) -> str:
        held = f"{self.used_mib / 1024:.1f} GiB"
        return f"pid {self.pid} {held}" if self.pid else f"{held} under no listed process, held before it started"


@dataclass(frozen=True)
class Failure:
    """One failing test (its id and its report's text), or the whole output where no report names one."""

    name: str
    text: str


@dataclass(frozen=True)
class Attempt:
    """What one run of a tier left: its exit status (negative: killed by that signal), its failures, its output,
    and the processes other than its own that held memory on its GPU while it ran (None: NVML unreadable)."""

    status: int
    failures: tuple[Failure, ...] = ()
    output: str = ""
    others: tuple[GpuProcess, ...] | None = None

    @cached_property
    def text(self) -> str:
        """The output and every failure's text, joined once (the clauses each search it; it can run to megabytes)."""
        return "\n".join([self.output, *(f.text for f in self.failures)])


@dataclass(frozen=True)
class Outcome:
    verdict: str
    cause: str

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.verdict]

    def __str__(self) -> str:
        return f"{self.verdict}: {self.cause}"


def _first_line(text: str, needle: str) -> str:
    line = next((ln for ln in text.splitlines() if needle.lower() in ln.lower()), needle).strip()
    return line if len(line) <= 240 else line[:237] + "..."


def _found(text: str, needles: Sequence[str]) -> str | None:
    low = text.lower()
    return next((n for n in needles if n.lower() in low), None)


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def passed(a: Attempt) -> Outcome | None:
    return Outcome(PASS, "exit 0") if a.status == 0 else None


def hardware_xid(a: Attempt) -> Outcome | None:
    for m in _XID.finditer(a.text):
        code = int(m.group(1))
        if code in HARDWARE_XIDS:
            return Outcome(RUNNER_FAULT, f"driver error: Xid {code} ({HARDWARE_XIDS[code]})")
    return None


def kernel_fault(a: Attempt) -> Outcome | None:
    text = a.text
    hit = _found(text, KERNEL_FAULTS)
    return Outcome(FAIL, f"a kernel of the build faulted: {_first_line(text, hit)}") if hit else None


def driver_error(a: Attempt) -> Outcome | None:
    text = a.text
    hit = _found(text, DRIVER_ERRORS)
    return Outcome(RUNNER_FAULT, f"driver error: {_first_line(text, hit)}") if hit else None


def lost_runner(a: Attempt) -> Outcome | None:
    status = a.status if a.status < 0 else -(a.status - 128) if a.status > 128 else 0
    if status < 0 and -status in RUNNER_SIGNALS:
        return Outcome(RUNNER_FAULT, f"lost runner: the tier was killed by {RUNNER_SIGNALS[-status]}")
    hit = _found(a.text, LOST_RUNNER)
    return Outcome(RUNNER_FAULT, f"lost runner: {_first_line(a.text, hit)}") if hit else None


def not_out_of_memory(a: Attempt) -> Outcome | None:
    plain = [f for f in a.failures or (Failure("", a.output),) if not OUT_OF_MEMORY.search(f.text)]
    if not plain:
        return None
    if not plain[0].name:
        return Outcome(FAIL, f"exit {a.status}, no failing test named")
    more = f" and {len(plain) - 1} more" if len(plain) > 1 else ""
    return Outcome(FAIL, f"{plain[0].name} failed{more}")


def _oom_line(a: Attempt) -> str:
    m = OUT_OF_MEMORY.search(a.text)
    return _first_line(a.text, m.group(0)) if m else "out of memory"


def oom_unknown_others(a: Attempt) -> Outcome | None:
    if a.others is None:
        return Outcome(FAIL, f"out of memory, and NVML could not say who else held the GPU's memory: {_oom_line(a)}")
    return None


def oom_alone(a: Attempt) -> Outcome | None:
    if not a.others:
        return Outcome(
            FAIL, f"out of memory with the GPU to itself (no other process held memory on it): {_oom_line(a)}"
        )
    return None


def _mib(match: re.Match[str] | None) -> float | None:
    return float(match.group(1)) * _UNITS[match.group(2)] if match else None


def oom_too_large_anyway(a: Attempt) -> Outcome | None:
    text = a.text
    tried = max((float(m.group(1)) * _UNITS[m.group(2)] for m in _TRIED.finditer(text)), default=None)
    free = _mib(_FREE.search(text))
    held = sum(p.used_mib for p in a.others or ())
    if tried is not None and free is not None and tried > free + held:
        return Outcome(
            FAIL,
            f"out of memory: the build asked for {_gib(tried)}, more than the {_gib(free)} free and the {_gib(held)} "
            "the other processes held together",
        )
    return None


def oom_beside_others(a: Attempt) -> Outcome | None:
    others = a.others or ()
    shown = ", ".join(map(str, others[:6])) + (" ..." if len(others) > 6 else "")
    held = sum(p.used_mib for p in others)
    return Outcome(
        RUNNER_FAULT,
        f"out of memory while {len(others)} other process(es) held {_gib(held)} of its GPU ({shown}): {_oom_line(a)}",
    )


CLAUSES: tuple[Callable[[Attempt], Outcome | None], ...] = (
    passed,
    hardware_xid,
    kernel_fault,
    driver_error,
    lost_runner,
    not_out_of_memory,
    oom_unknown_others,
    oom_alone,
    oom_too_large_anyway,
    oom_beside_others,
)
"""The clauses in the order the module docstring gives them; ``not_out_of_memory`` ends every case that is not an
out-of-memory error, so the last clause sees only those."""


def classify(attempt: Attempt) -> Outcome:
    """The first clause that answers."""
    for clause in CLAUSES:
        outcome = clause(attempt)
        if outcome is not None:
            return outcome
    raise AssertionError("unreachable: oom_beside_others always answers")  # pragma: no cover
