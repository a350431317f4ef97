"""Hypothesis strategies for fused-MoE cases: the one place tests draw inputs from."""

from moegate.strategies.boundary import BOUNDARY_EXAMPLES, aim_at_boundary, pin_boundaries
from moegate.strategies.moe import KERNEL_SHAPES, moe_cases

__all__ = ["BOUNDARY_EXAMPLES", "KERNEL_SHAPES", "aim_at_boundary", "moe_cases", "pin_boundaries"]
