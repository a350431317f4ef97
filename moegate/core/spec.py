"""The dispatch rule under test, as an executable specification.

Written from the rule stated in docs/spec.md, not from
vLLM's code: for a case and an entrypoint, which block-assignment path the Triton
fused-MoE must take, and the first clause of the rule that decides it. The
clauses are checked in a fixed order so the reason is stable and reviewable in
the dispatch-table golden.

Fused shared-expert rows (``MoECase.shared_experts``) are experts like any
other as far as the rule is concerned: each adds a row to w13 and w2 and an id
to every token's top-k. So the rule's "experts" counts them (all of w1's rows
without an expert map, the whole id space with one) and its "top_k" is the
number of ids per token, shared slots included. Nothing else changes: an expert
map still forces sorted, and host residency of either weight still forces
sorted, whether or not the host-resident rows are shared ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from moegate.core.case import ENTRYPOINTS, DispatchPath, MoECase

SPARSITY_FACTOR = 4
"""The naive path is allowed while ``tokens * top_k * 4 <= experts``."""


@dataclass(frozen=True)
class Decision:
    path: DispatchPath
    reason: str
    clause: str
    """The deciding clause's name, as the dispatch-table golden prints it (``CLAUSES``)."""

    def __str__(self) -> str:
        return f"{self.path} ({self.reason})"


CLAUSES = {
    "wna16-modular": "the modular entrypoint's wNa16 Triton experts always align",
    "wna16-group": "weight-only int8/int4 with a group size always aligns",
    "expert-map": "an expert map (expert parallelism) always aligns",
    "outside-naive": "tokens * ids per token * 4 > experts counted: sorted",
    "host-resident": "either weight host-resident: sorted (vLLM 0.33.0's clause)",
    "naive": "tokens * ids per token * 4 <= experts counted, weights on the device: naive",
}
"""Every clause of ``expected_path``, in the order it checks them: name and what it says."""


def experts_counted(case: MoECase, entrypoint: str) -> int:
    """The expert count each entrypoint compares against.

    The legacy entrypoint is handed the global count. The modular one counts
    ``w1.shape[0]`` (the local experts) unless an expert map is given, in which
    case it uses the global count; without an expert map the two are equal.
    With fused shared rows, "global" is the whole id space the map covers
    (routed experts plus shared rows) and ``w1.shape[0]`` holds the shared rows
    too, so again the two agree without an expert map.
    """
    if entrypoint not in ENTRYPOINTS:
        raise ValueError(f"unknown entrypoint {entrypoint!r}; expected one of {ENTRYPOINTS}")
    if entrypoint == "modular" and case.expert_map is None:
        return case.local_experts
    return case.total_experts


def _pairs_text(case: MoECase) -> str:
    """``tokens*ids_per_token*4=N`` as the reasons print it; shared slots show as ``(top_k+shared)``."""
    k = str(case.top_k) if not case.shared_experts else f"({case.top_k}+{case.shared_experts})"
    return f"{case.num_tokens}*{k}*{SPARSITY_FACTOR}={case.pairs * SPARSITY_FACTOR}"


def in_naive_region(case: MoECase, entrypoint: str = "legacy") -> bool:
    """The small-batch region where device-resident weights get one block per pair."""
    return case.pairs * SPARSITY_FACTOR <= experts_counted(case, entrypoint)


def expected_path(case: MoECase, entrypoint: str, *, host_rule: bool = True) -> Decision:
    """The path ``entrypoint`` must take for ``case``.

    ``host_rule=False`` gives the rule as it stood before vLLM 0.33.0 (no
    host-residency clause); the meta-check uses it to say what the base does.
    """
    counted = experts_counted(case, entrypoint)
    wna16 = case.quant if case.quant is not None and case.quant.weight_only else None
    if wna16 is not None and entrypoint == "modular":
        return Decision(
            DispatchPath.SORTED, f"{wna16.scheme}: the modular wNa16 Triton experts always align", "wna16-modular"
        )
    if wna16 is not None and wna16.group_size > 0:
        return Decision(
            DispatchPath.SORTED, f"{wna16.scheme} with group size {wna16.group_size} always aligns", "wna16-group"
        )
    # fp8 (weights and activations) follows the unquantized rule, block-wise included:
    # the group-size clause is about weight-only integer kernels.
    if case.expert_map is not None:
        return Decision(DispatchPath.SORTED, "expert map given (expert parallelism)", "expert-map")
    if case.pairs * SPARSITY_FACTOR > counted:
        return Decision(
            DispatchPath.SORTED,
            f"outside naive region: {_pairs_text(case)} > {counted}",
            "outside-naive",
        )
    if host_rule and case.placement.host_resident:
        return Decision(DispatchPath.SORTED, f"host-resident weights ({case.placement.label})", "host-resident")
    return Decision(
        DispatchPath.NAIVE,
        f"naive region: {_pairs_text(case)} <= {counted}"
        + ("" if not case.placement.host_resident else ", host rule off"),
        "naive",
    )
