"""The reviewed classification of dispatch sites the census's rules cannot settle by themselves.

Keyed by ``<file>::<scope>`` as the census writes a site (file relative to the vllm
package). Each entry is (rule, reason): ``exception`` for a caller of the decision
allowed to keep the naive path for host-resident weights, ``always aligns`` for an
alignment on some paths whose other paths align too. Adding or changing an entry is
a review: it changes the census, which changes only through its bless command, and
``tests/dispatch/test_dispatch_sites.py`` checks each exception behaves as reviewed.
"""

from __future__ import annotations

EXCEPTION = "exception"
ALWAYS_ALIGNS = "always aligns"

_KEEPS_OLD_RULE = (
    "PR #62054 (docs/spec.md) leaves this model-specific caller of the decision without the host flag on "
    "purpose: it keeps the pre-0.33.0 rule (naive for host-resident weights in the naive region) and can opt in "
    "separately"
)

REVIEWED: dict[str, tuple[str, str]] = {
    "model_executor/models/k2_horizon.py::fused_mova_impl": (EXCEPTION, _KEEPS_OLD_RULE),
    "models/dots3_note/nvidia/vision_moe.py::note_vision_fused_moe_fp8": (
        EXCEPTION,
        _KEEPS_OLD_RULE + "; the vision encoder's block-fp8 MoE, no expert map",
    ),
    "model_executor/layers/fused_moe/experts/fused_humming_moe.py::HummingIndexedExperts.prepare_humming_moe_kwargs": (
        ALWAYS_ALIGNS,
        "the other branch (CUDA with DeepEP's per-rank prefix sums) aligns with fused_globalize_align_block_size",
    ),
    "model_executor/layers/fused_moe/experts/fused_humming_moe.py::HummingIndexedExperts.prepare_humming_moe_kwargs#2": (
        ALWAYS_ALIGNS,
        "re-aligns for w2 when its tuned block size differs from w13's; otherwise w2 reuses the first alignment",
    ),
}
