"""The dispatch rule under test, as an executable specification.

Written from the rule stated in docs/spec.md, not from
vLLM's code: for a case and an entrypoint, which block-assignment path the Triton
fused-MoE must take, and the first clause of the rule that decides it. The
clauses are checked in a fixed order so the reason is stable and reviewable in
the dispatch-table golden.
"""

from __future__ import annotations

from dataclasses import dataclass

from moegate.case import ENTRYPOINTS, DispatchPath, MoECase

SPARSITY_FACTOR = 4
"""The naive path is allowed while ``tokens * top_k * 4 <= experts``."""


@dataclass(frozen=True)
class Decision:
    path: DispatchPath
    reason: str

    def __str__(self) -> str:
        return f"{self.path} ({self.reason})"


def experts_counted(case: MoECase, entrypoint: str) -> int:
    """The expert count each entrypoint compares against.

    The legacy entrypoint is handed the global count. The modular one counts
    ``w1.shape[0]`` (the local experts) unless an expert map is given, in which
    case it uses the global count; without an expert map the two are equal.
    """
    if entrypoint not in ENTRYPOINTS:
        raise ValueError(f"unknown entrypoint {entrypoint!r}; expected one of {ENTRYPOINTS}")
    if entrypoint == "modular" and case.expert_map is None:
        return case.local_experts
    return case.num_experts


def in_naive_region(case: MoECase, entrypoint: str = "legacy") -> bool:
    """The small-batch region where device-resident weights get one block per pair."""
    return case.pairs * SPARSITY_FACTOR <= experts_counted(case, entrypoint)


def expected_path(case: MoECase, entrypoint: str, *, host_rule: bool = True) -> Decision:
    """The path ``entrypoint`` must take for ``case``.

    ``host_rule=False`` gives the rule as it stood before vLLM 0.33.0 (no
    host-residency clause); the meta-check uses it to say what the base does.
    """
    counted = experts_counted(case, entrypoint)
    wna16 = case.quant is not None and case.quant.weight_only
    if wna16 and entrypoint == "modular":
        return Decision(DispatchPath.SORTED, f"{case.quant.scheme}: the modular wNa16 Triton experts always align")
    if wna16 and case.quant.group_size > 0:
        return Decision(
            DispatchPath.SORTED, f"{case.quant.scheme} with group size {case.quant.group_size} always aligns"
        )
    # fp8 (weights and activations) follows the unquantized rule, block-wise included:
    # the group-size clause is about weight-only integer kernels.
    if case.expert_map is not None:
        return Decision(DispatchPath.SORTED, "expert map given (expert parallelism)")
    if case.pairs * SPARSITY_FACTOR > counted:
        return Decision(
            DispatchPath.SORTED,
            f"outside naive region: {case.num_tokens}*{case.top_k}*{SPARSITY_FACTOR}={case.pairs * SPARSITY_FACTOR} > {counted}",
        )
    if host_rule and case.placement.host_resident:
        return Decision(DispatchPath.SORTED, f"host-resident weights ({case.placement.label})")
    return Decision(
        DispatchPath.NAIVE,
        f"naive region: {case.num_tokens}*{case.top_k}*{SPARSITY_FACTOR}={case.pairs * SPARSITY_FACTOR} <= {counted}"
        + ("" if not case.placement.host_resident else ", host rule off"),
    )
