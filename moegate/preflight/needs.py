"""What the legs need of a runner: pinned host memory and free GPU memory, each derived below.

**Pinned host memory.** vLLM's UVA offloader pins each expert weight it moves (up to ``--cpu-offload-gb``, but never
more than the model's experts), so the need is the largest model's expert bytes: the A/B's wide model holds 4 layers
x 128 experts x 3 x 2048 x 768 bf16 = 4.83 GB = 4.5 GiB of experts; pinned allocations round each one up, and two
servers of a pair may overlap at a hand-over, hence the default of 8 GiB. ``--model DIR`` (repeatable) makes the need
follow what the legs will load instead: twice each model's expert bytes (a pair's two servers hold theirs at once;
the e2e tier serves both builds together, the A/B hands over), read from its ``config.json``; ``--need-pinned-gib``
is added to that (a kernel leg's own pinned weights beside the e2e legs).

**Free GPU memory, per leg** (``gpu_need``, ``--leg``; a GPU of ``T`` GiB in all). vLLM refuses to start an engine
with less free memory than its ``gpu_memory_utilization`` share of the whole GPU (``request_memory`` in
``vllm/v1/worker/utils.py``, 0.33.0), whatever it then allocates, so each leg's need is the largest such share it
asks for plus what its own processes already hold when that engine starts:

- ``kernels``: ``max(16, 0.15 T + 8)`` GiB. The calls at the kernel's 32-bit index boundary take about 10 GiB and
  the test skips them below 16 GiB free (``tests/kernels/test_kernel_census.py``), so a leg with less runs less than
  it claims. The tier's offline engines ask for 0.15 of the GPU (``moegate/model/engine.py``; offload truth's ask
  0.05) while the session's weight bank is held: a bank at 5,000 cases peaked at 6.0-7.9 GiB per sweep worker
  (``results/kernels-0.33.0.md``), 8 GiB. A sweep sizes its workers to the GPU and needs one such worker.
  H100 (79.2 GiB): 19.9; H200 (140.4 GiB): 29.1; a 24-GiB RTX 4090: 16.
- ``e2e`` (each model): ``0.25 T + 3`` GiB. A leg serves three servers at once (the two builds and the reference
  re-rounding, ``moegate e2e run``), each asking for 0.25 of the GPU at its start (``tooling/serving.py``'s GPU
  flags) while the other two hold their fixed 1-GiB KV cache, the tiny model (0.01 GiB: "Model loading took 0.01 GiB"
  in the H200 rehearsal's server logs) and a CUDA context with its activations (about 0.5 GiB, not measured here):
  2 x 1.5 GiB. H100: 22.8; H200: 38.1; RTX 4090: 9.
- ``ab``: ``0.25 T + 1.5`` GiB: the A/B starts one server at a time, and the last one's memory may linger at a
  hand-over.

Legs named together (``--leg kernels --leg e2e``) run side by side on the one GPU, so their needs add up.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from moegate.ab.evidence import MoEShape
from moegate.preflight.report import GIB, PreflightError

DEFAULT_PINNED_GIB = 8.0
LEGS = ("kernels", "e2e", "ab")
INDEX_WIDTH_FREE_GIB = 16.0
"""The free memory below which the calls at the 32-bit index boundary skip (``tests/kernels/test_kernel_census.py``)."""
KERNEL_ENGINE_SHARE = 0.15
"""The largest ``gpu_memory_utilization`` the kernel tier's offline engines ask for (``moegate/model/engine.py``)."""
KERNEL_BANK_GIB = 8.0
"""The weight bank beside them: a sweep worker peaked at 6.0-7.9 GiB (``results/kernels-0.33.0.md``)."""
SERVER_SHARE = 0.25
"""``--gpu-memory-utilization`` of the e2e and A/B servers on a GPU (``tooling/serving.py``)."""
SERVER_HELD_GIB = 1.5
"""What a started server holds: its 1-GiB KV cache, the tiny model (0.01 GiB) and a CUDA context (about 0.5 GiB)."""


def gpu_need(leg: str, total_gib: float) -> float:
    """Free GPU memory (GiB) one ``leg`` needs on a GPU of ``total_gib``: the module docstring derives each."""
    if leg == "kernels":
        return max(INDEX_WIDTH_FREE_GIB, KERNEL_ENGINE_SHARE * total_gib + KERNEL_BANK_GIB)
    if leg == "e2e":
        return SERVER_SHARE * total_gib + 2 * SERVER_HELD_GIB
    if leg == "ab":
        return SERVER_SHARE * total_gib + SERVER_HELD_GIB
    raise PreflightError(f"--leg {leg!r}: choose from {', '.join(LEGS)}")


def gpu_needs(legs: Sequence[str], total_gib: float) -> tuple[float, str]:
    """The legs' summed need (they run side by side) and how it was reckoned, e.g. ``kernels 19.9 + e2e 22.8``."""
    parts = [(leg, gpu_need(leg, total_gib)) for leg in legs]
    return sum(g for _, g in parts), " + ".join(f"{leg} {g:.1f}" for leg, g in parts)


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
