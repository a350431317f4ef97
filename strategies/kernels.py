"""Cases the GPU kernel tier can run, drawn from the same ``moe_cases`` as the dispatch tier.

``moe_cases(kernel_shapes=True)`` already limits (experts, hidden, intermediate)
to ``KERNEL_SHAPES`` (multiples of 128: every BLOCK_SIZE_K vLLM's configs pick
divides them, and every wNa16 group size 32/64/128 divides them). On top of that
this module excludes what vLLM's kernels do not support, each with its constraint:

- int4_w4a16 per-channel (group size 0): the legacy entrypoint sends ungrouped
  wNa16 weights to the plain Triton kernel, which has an int8_w8a16 branch only;
  int4 is served by the grouped (GPTQ/AWQ) kernels. Mapped to group size 128.
- wNa16 at the modular entrypoint needs a group size: ``TritonWNA16Experts``
  launches the grouped kernel, which asserts ``block_shape`` is given. Mapped to
  group size 128.
- group sizes below 32 (the dispatch tier draws group size 1, the boundary of the
  ``block_shape[1] > 0`` clause): not a layout vLLM's wNa16 kernels are tuned or
  tested for. Mapped to group size 128.
- the Qwen3-30B-A3B shape (128 experts, hidden 2048) in bfloat16 only: a float32
  copy would pin 2.4 GB of host memory for no dispatch-relevant difference.
- fp8 per-tensor with an expert map at the legacy entrypoint: ``fused_experts_impl``
  drops remote experts' pairs at alignment (``ignore_invalid_experts=True``), so their
  rows of the intermediate cache are never written, yet the second product's
  dynamic per-tensor activation scale is taken over every row, unwritten ones
  included: the output depends on stale memory. (The modular experts avoid it:
  ``a2_scale_is_global`` keeps those pairs.) A numerics question of the legacy
  API, not of dispatch. Mapped to block-wise fp8, whose scales are per token.
- fp8 needs a GPU with fp8 tensor cores (compute capability 8.9+); callers pass
  ``schemes="wna16"`` elsewhere (``tests/kernels/conftest.py``: ``QUANT_FAMILY``).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from moegate.case import MoECase, Placement, Quant
from strategies.moe import moe_cases

MAX_KERNEL_TOKENS = 16
"""Decode-sized batches and just past the naive threshold; Triton compiles per token bucket."""

BIG_SHAPE = (128, 2048, 768)


def _supported(case: MoECase, entrypoint: str) -> MoECase:
    q = case.quant
    if q is None:
        return case
    if q.weight_only and (
        (q.group_size <= 0 and (q.scheme == "int4_w4a16" or entrypoint == "modular")) or 0 < q.group_size < 32
    ):
        return MoECase.from_dict({**case.to_dict(), "quant": {"scheme": q.scheme, "group_size": 128}})
    if not q.weight_only and q.group_size <= 0 and case.expert_map is not None and entrypoint == "legacy":
        return MoECase.from_dict({**case.to_dict(), "quant": {"scheme": q.scheme, "group_size": 128}})
    return case


def _fits(case: MoECase) -> bool:
    big = (case.num_experts, case.hidden, case.intermediate) == BIG_SHAPE
    return not big or case.dtype == "bfloat16"


def kernel_cases(
    entrypoint: str,
    *,
    placement: Placement | st.SearchStrategy[Placement] | None = None,
    region: str | None = None,
    expert_map: bool | None = None,
    quant: bool | None = False,
    schemes: str | None = None,
    **kwargs: Any,
) -> st.SearchStrategy[MoECase]:
    """``moe_cases`` restricted to what vLLM's GPU kernels run (see module docstring)."""
    base = moe_cases(
        placement=placement,
        region=region,
        expert_map=expert_map,
        quant=quant,
        schemes=schemes,
        kernel_shapes=True,
        max_tokens=kwargs.pop("max_tokens", MAX_KERNEL_TOKENS),
        **kwargs,
    )
    return base.map(lambda c: _supported(c, entrypoint)).filter(_fits)


__all__ = ["BIG_SHAPE", "MAX_KERNEL_TOKENS", "Quant", "kernel_cases"]
