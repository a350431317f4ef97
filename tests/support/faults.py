"""What the runner-fault tests share: the texts a failing GPU tier prints, as torch, CUDA, the driver and pytest
print them, and a process on the GPU that is not the tier's own."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB"
    " of which 1.06 GiB is free. Process 4711 has 70.00 GiB memory in use. Including non-PyTorch memory, this process"
    " has 8.10 GiB memory in use. Of the allocated memory 6.20 GiB is allocated by PyTorch, and 1.10 GiB is reserved"
    " by PyTorch but unallocated. If reserved but unallocated memory is large try setting"
    " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory"
    " Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
"""torch 2.11's message for a caching-allocator failure, at an H100's figures."""
OOM_HUGE = OOM.replace("Tried to allocate 2.00 GiB", "Tried to allocate 1024.00 GiB")
"""The same, for an allocation no GPU of this size holds (a planted workspace of 1 TiB)."""
OOM_TRACEBACK = f"""Traceback (most recent call last):
  File "/work/tests/kernels/test_kernel_properties.py", line 34, in test_output_matches_reference
    result = run_checked(cuda_target, bank, case, entrypoint)
  File "/work/moegate/kernels/check.py", line 97, in run_checked
    t, w1, w2 = bank.inputs(case)
  File "/work/moegate/kernels/inputs.py", line 199, in weights
    stored = _draw_stored(case, self.device)
{OOM}
"""
BUG = """    def test_output_matches_reference(cuda_target, bank, warm, entrypoint, data):
>       assert result.closeness.ok, "output outside the tolerance of moegate.kernels.reference:\\n" + result.describe()
E       AssertionError: output outside the tolerance of moegate.kernels.reference:
E         legacy placement=w13-host tokens=3 top_k=2 experts=8 dtype=bfloat16 path=sorted: max |out-ref|=0.412, worst err/tol=57.3, rel max err=38.112%
E         at the worst element: reference 0.523438, kernel 0.935547, tolerance 0.00719
E         case: {"apply_router_weight_on_input":false,"dtype":"bfloat16","num_experts":8,"num_tokens":3,"top_k":2}
"""
"""A planted bug's failure in the kernel tier (``expert=0:1``: expert 0's blocks read expert 1's weights)."""
ILLEGAL_ADDRESS = (
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be"
    " incorrect.\nNVRM: Xid (PCI:0000:19:00): 31, pid=4711, name=python, Ch 00000008, intr 00000000. MMU Fault"
)
FALLEN_OFF = (
    "NVRM: Xid (PCI:0000:19:00): 79, pid=1230, GPU has fallen off the bus.\nRuntimeError: CUDA error: unknown error"
)
OLD_DRIVER = (
    "RuntimeError: The NVIDIA driver on your system is too old (found version 12020). ... CUDA driver version is"
    " insufficient for CUDA runtime version"
)


@contextmanager
def neighbour() -> Iterator[int]:
    """A real process that is not the caller's: ``sleep``, started from a shell that exits at once, so the sleep is
    re-parented away from the caller and its environment carries no attempt's token. Yields its pid; killed after."""
    done = subprocess.run(
        ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k != "MOEGATE_ATTEMPT"},
    )  # fmt: skip
    pid = int(done.stdout.strip())
    time.sleep(0.05)
    try:
        yield pid
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
