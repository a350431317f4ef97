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

COLUMNS = ("top_k", "experts", "placement", "expert_map", "quant", "tokens: path (clause)")
"""A path (and a clause) reads ``legacy/modular`` where the two entrypoints differ."""


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


def _cell(case: MoECase, observe: Callable[[MoECase, str], str]) -> str:
    """One case's paths and deciding clauses: ``naive (naive)``, or ``naive/sorted (a/b)`` where the entrypoints
    differ (legacy first)."""
    paths = [observe(case, ep) for ep in ENTRYPOINTS]
    clauses = [expected_path(case, ep).clause for ep in ENTRYPOINTS]
    path = paths[0] if len(set(paths)) == 1 else "/".join(paths)
    clause = clauses[0] if len(set(clauses)) == 1 else "/".join(clauses)
    return f"{path} ({clause})"


def _key(case: MoECase) -> tuple[str, ...]:
    """A row's columns: every field of the case but its token count."""
    em = "none" if case.expert_map is None else f"ep{case.expert_map.ep_rank}/{case.expert_map.ep_size}"
    q = "off" if case.quant is None else f"{case.quant.scheme}/g{case.quant.group_size}"
    experts = f"{case.num_experts}+{case.shared_experts}" if case.shared_experts else str(case.num_experts)
    return (str(case.top_k), experts, case.placement.label, em, q)


def _runs(cells: list[tuple[int, str]]) -> str:
    """``1-3 naive (naive); 4-16 sorted (outside-naive)``: each run of token counts with the same cell."""
    out: list[str] = []
    start, prev, cell = cells[0][0], cells[0][0], cells[0][1]
    for tokens, c in [*cells[1:], (-1, "")]:
        if c == cell and tokens == prev + 1:
            prev = tokens
            continue
        out.append(f"{start}-{prev} {cell}" if prev != start else f"{start} {cell}")
        start, prev, cell = tokens, tokens, c
    return "; ".join(out)


def render(observe: Callable[[MoECase, str], str]) -> str:
    """The table body: a header row, then one row per grid shape (every field but the token count, in the grid's
    order), its token counts in runs that take the same paths for the same clause. A boundary that moves, a path
    that changes at one token count, shows as a changed run."""
    rows: dict[tuple[str, ...], list[tuple[int, str]]] = {}
    for case in grid():
        rows.setdefault(_key(case), []).append((case.num_tokens, _cell(case, observe)))
    lines = ["\t".join(k) + "\t" + _runs(sorted(cells)) for k, cells in rows.items()]
    return "\t".join(COLUMNS) + "\n" + "".join(line + "\n" for line in lines)
