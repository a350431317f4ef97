"""Where vLLM's fused MoE runs out of 32-bit indices, and the token counts that reach it.

Read from vLLM 0.33.0's ``fused_moe.py`` and ``moe_align_block_size.py`` (facts, in
moegate's words):

1. **The kernel's offsets.** The Triton kernel addresses its tensors as ``base +
   stride * row``: rows of the hidden states (``tokens`` of ``K``), of the first
   product's output (the intermediate cache, ``pairs`` rows of ``w13_rows``) and of the
   second product's (``pairs`` rows of ``K``), ``pairs`` being tokens times ids per token.
   The largest offset a call forms is ``pairs * max(w13_rows, K) - 1``: its *extent*
   minus one. vLLM 0.33.0 widens the row index to 64 bits before multiplying ("stride_cm *
   offs_token can exceed int32 for large token counts"); a kernel multiplying in 32 bits
   (as vLLM's did before that fix) writes outside its tensors once the extent passes
   ``2**31``. The boundary is drawn on both sides: the largest token count whose extent
   stays within ``2**31`` (every offset fits a signed 32-bit integer) and the next one.
2. **The alignment's ids.** ``moe_align_block_size`` writes int32 sorted ids (each at most
   ``pairs``, the padding id) into ``pairs + experts * (BLOCK_SIZE_M - 1)`` slots and their
   count into an int32: exhausted only near ``2**31`` pairs, two billion ids (8 GiB of
   ``topk_ids`` alone), which neither tier draws; ``alignment_extent`` states it.

In one call with 8 ids per token and an intermediate of 2,048 (w13 rows 4,096), the
kernel boundary is at 65,536 tokens: a long prefill, not an exotic shape.
"""

from __future__ import annotations

from moegate.core.case import MoECase

INT32_LIMIT = 2**31
"""Offsets up to ``INT32_LIMIT - 1`` fit a signed 32-bit integer."""

SIDES = (-1, 0, 1)
"""``tokens_at_kernel_boundary``'s sides: one token below the last fitting count, the last fitting, the first past."""


def row_width(case: MoECase) -> int:
    """Elements per (token, expert) row of the widest tensor the kernel indexes by pair."""
    return max(case.w13_rows, case.hidden)


def kernel_extent(case: MoECase) -> int:
    """One past the largest element offset the Triton kernel forms for ``case`` (fact 1)."""
    return case.pairs * row_width(case)


def fits_int32(case: MoECase) -> bool:
    return kernel_extent(case) <= INT32_LIMIT


def alignment_extent(case: MoECase, block_m: int) -> int:
    """Slots of the alignment's int32 sorted ids (fact 2)."""
    return case.pairs + case.total_experts * (block_m - 1)


def tokens_at_kernel_boundary(ids_per_token: int, width: int, side: int) -> int:
    """The token count on ``side`` of the kernel's 32-bit boundary for rows of ``width`` elements.

    0: the largest count whose extent is at most ``2**31``; -1: one fewer; +1: one more
    (its extent passes ``2**31``).
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, not {side}")
    last_fitting = INT32_LIMIT // (ids_per_token * width)
    return max(1, last_fitting + side)
