"""Hypothesis strategies for fused-MoE cases: the one place tests draw inputs from."""

from moegate.strategies.moe import BOUNDARY_EXAMPLES, KERNEL_SHAPES, aim_at_boundary, moe_cases, pin_boundaries

__all__ = ["BOUNDARY_EXAMPLES", "KERNEL_SHAPES", "aim_at_boundary", "moe_cases", "pin_boundaries"]
