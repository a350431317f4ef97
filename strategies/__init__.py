"""Hypothesis strategies for fused-MoE cases: the one place tests draw inputs from."""

from strategies.moe import (
    BOUNDARY_EXAMPLES,
    KERNEL_SHAPES,
    aim_at_boundary,
    dtypes,
    expert_counts,
    expert_maps,
    hidden_sizes,
    intermediate_sizes,
    moe_cases,
    placements,
    quants,
    routings,
    token_counts,
    top_ks,
)

__all__ = [
    "BOUNDARY_EXAMPLES",
    "KERNEL_SHAPES",
    "aim_at_boundary",
    "dtypes",
    "expert_counts",
    "expert_maps",
    "hidden_sizes",
    "intermediate_sizes",
    "moe_cases",
    "placements",
    "quants",
    "routings",
    "token_counts",
    "top_ks",
]
