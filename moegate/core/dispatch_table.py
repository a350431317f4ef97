"""The dispatch table: the path each entrypoint takes over a fixed canonical grid.

Stored in ``golden/dispatch-table.tsv``. Any change to vLLM's dispatch policy,
intended or not, shows up in review as changed rows, each with the spec's
deciding clause beside it (its name from ``spec.CLAUSES``, which the golden's
header spells out; ``moegate spec '<case json>'`` prints the full reason with
its arithmetic); a refactor that silently bypasses a path is caught even where
outputs stay equal.

Cases with fused shared-expert rows follow the plain grid, so adding them added
rows at the end and changed none: their ``experts`` column reads
``routed+shared`` (``64+1``), ``top_k`` stays the routed top-k.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

from moegate.core.case import ALL_PLACEMENTS, ENTRYPOINTS, ExpertMap, MoECase, Quant
from moegate.core.spec import expected_path

TOKENS = tuple(range(1, 17))
TOP_KS = (1, 2, 4, 8)
EXPERTS = (8, 16, 32, 64, 128, 256)
EXPERT_MAPS: tuple[ExpertMap | None, ...] = (None, ExpertMap(ep_size=2, ep_rank=0))
QUANTS: tuple[Quant | None, ...] = (None, Quant("int4_w4a16", 128), Quant("fp8_w8a8", 128))
"""Unquantized; grouped wNa16 (always aligns); fp8 128 x 128 blocks (``block_shape[1] > 0`` but not wNa16)."""
SHARED_EXPERTS = (1, 2)
"""Fused shared-expert rows of the shared grid (unquantized: quantization meets the rule the same way with them)."""

COLUMNS = ("tokens", "top_k", "experts", "placement", "expert_map", "quant", "legacy", "modular", "spec")


def grid() -> Iterator[MoECase]:
    """The plain grid, then the same shapes with fused shared-expert rows (after it, so old rows keep their place)."""
    for tokens, k, e, p, em, q in itertools.product(TOKENS, TOP_KS, EXPERTS, ALL_PLACEMENTS, EXPERT_MAPS, QUANTS):
        yield MoECase(
            num_tokens=tokens, top_k=k, num_experts=e, hidden=128, intermediate=128, placement=p, expert_map=em, quant=q
        )
    for shared, tokens, k, e, p, em in itertools.product(
        SHARED_EXPERTS, TOKENS, TOP_KS, EXPERTS, ALL_PLACEMENTS, EXPERT_MAPS
    ):
        yield MoECase(
            num_tokens=tokens,
            top_k=k,
            num_experts=e,
            hidden=128,
            intermediate=128,
            placement=p,
            expert_map=em,
            shared_experts=shared,
        )


def row(case: MoECase, observe: Callable[[MoECase, str], str]) -> str:
    paths = [observe(case, ep) for ep in ENTRYPOINTS]
    reasons = {ep: expected_path(case, ep).clause for ep in ENTRYPOINTS}
    spec = (
        reasons["legacy"]
        if reasons["legacy"] == reasons["modular"]
        else "; ".join(f"{ep}: {r}" for ep, r in reasons.items())
    )
    em = "none" if case.expert_map is None else f"ep{case.expert_map.ep_rank}/{case.expert_map.ep_size}"
    q = "off" if case.quant is None else f"{case.quant.scheme}/g{case.quant.group_size}"
    experts = f"{case.num_experts}+{case.shared_experts}" if case.shared_experts else case.num_experts
    fields = [case.num_tokens, case.top_k, experts, case.placement.label, em, q, *paths, spec]
    return "\t".join(str(f) for f in fields) + "\n"


def render(observe: Callable[[MoECase, str], str]) -> str:
    """The table body: a header row, then one row per grid case."""
    return "\t".join(COLUMNS) + "\n" + "".join(row(c, observe) for c in grid())
