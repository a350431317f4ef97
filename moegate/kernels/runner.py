"""What a kernel-sweep worker runs for each case: the real one (vLLM, run to the end and checked, ``VllmRunner``; the
differential tier's ``DiffRunner`` adds what the two builds are compared on) or, in the unit tier, a stand-in with
the same face (``Runner``)."""

from __future__ import annotations

import platform
import sys
from typing import Any, Protocol

from moegate.core.case import MoECase
from moegate.kernels.check import KernelResult, StageClock
from moegate.kernels.resources import triton_cache_in_use

# --- the workers ------------------------------------------------------------------------


class Runner(Protocol):
    """What a worker drives: the real one is ``VllmRunner``; the unit tier passes a stand-in."""

    info: dict[str, Any]

    def run(self, case: MoECase, entrypoint: str, clock: StageClock | None) -> KernelResult: ...

    def sync(self) -> None: ...

    def memory(self) -> dict[str, int]: ...


class VllmRunner:
    """A ``VllmTarget`` and a ``WeightBank`` on this process's GPU: ``run`` is ``run_checked``."""

    def __init__(self) -> None:
        import torch

        from moegate.dispatch.environment import describe_environment  # imports torch at its top
        from moegate.dispatch.target import VllmTarget  # imports torch at its top
        from moegate.kernels.check import run_checked  # imports torch at its top
        from moegate.kernels.inputs import WeightBank  # imports torch at its top

        self._torch, self._run_checked = torch, run_checked
        self.target = VllmTarget()
        if not self.target.cuda:
            raise RuntimeError("the kernel tier needs a CUDA GPU; this process sees none")
        self.bank = WeightBank(self.target.device, self.target.host_view)
        self.info = {
            "vllm": self.target.version,
            "fp8": torch.cuda.get_device_capability() >= (8, 9),  # fp8_w8a8 needs fp8 tensor cores
            "env": describe_environment(),
            "triton_cache": triton_cache_in_use(),
        }

    def run(self, case: MoECase, entrypoint: str, clock: StageClock | None) -> KernelResult:
        result: KernelResult = self._run_checked(self.target, self.bank, case, entrypoint, clock)
        return result

    def sync(self) -> None:
        self._torch.cuda.synchronize()

    def memory(self) -> dict[str, int]:
        cuda = self._torch.cuda
        return {
            "peak_allocated": cuda.max_memory_allocated(),
            "peak_reserved": cuda.max_memory_reserved(),
            "weights_device": self.bank.device_bytes,
            "weights_pinned": self.bank.host_bytes,
        }


class DiffRunner(VllmRunner):
    """One build's side of the differential tier (``moegate.kernels.diff_tier``): ``run_checked``, then the payload.

    The payload (``moegate.kernels.differential.payload``) carries the output, the path and a digest of every
    input; the base's worker (``reference=True``) adds the fp32 torch reference, so both builds' errors are
    taken against one reference computed in one place. ``info`` adds what decides whether two builds compare:
    the Python they run and the GPU they see.
    """

    def __init__(self, reference: bool) -> None:
        super().__init__()
        import torch

        from moegate.kernels.differential import Fingerprints  # imports torch at its top

        self.reference = reference
        self.fingerprints = Fingerprints()
        major, minor = torch.cuda.get_device_capability()
        self.info.update(
            python=platform.python_version(),
            executable=sys.executable,
            device=f"{torch.cuda.get_device_name()} (sm_{major}{minor})",
        )

    def run(self, case: MoECase, entrypoint: str, clock: StageClock | None) -> KernelResult:
        from moegate.kernels.differential import payload  # imports torch at its top

        result = super().run(case, entrypoint, clock)
        result.payload = payload(result, self.fingerprints, self.reference)
        return result
