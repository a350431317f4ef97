"""Traffic model: the expert-weight bytes one fused-MoE step reads, per block assignment.

The Triton fused-MoE kernel runs a grid of (row block, column tile) programs;
every row block belongs to one expert and its column tiles together read that
expert's whole w13 (first product) and w2 (second product) once. So the bytes a
step reads are ``sum over row blocks of (w13 + w2 bytes of the block's expert)``,
and the two paths differ only in their row blocks:

- **naive**: one block per (token, expert) pair, so an expert routed to ``c``
  tokens is read ``c`` times;
- **sorted**: ``moe_align_block_size`` pads each expert's pairs to a multiple of
  ``BLOCK_SIZE_M`` and gives it ``ceil(c / BLOCK_SIZE_M)`` blocks: an expert is
  read once per step as long as it has at most ``BLOCK_SIZE_M`` pairs, which is
  every decode step of interest.

Blocks whose expert is owned by another rank (expert map value ``-1``) write
zeros and read no weights. With host-resident weights (UVA), every one of these
bytes crosses PCIe, which is why the step time follows this model.

No vLLM import: the block assignments are computed here from their definition,
and the kernel tier checks them against the real ``moe_align_block_size``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from moegate.core.case import MoECase, Placement
from moegate.core.tensors import torch_dtype, weight_shapes

IdRows = Sequence[Sequence[int]] | torch.Tensor


def _rows(topk_ids: IdRows) -> list[list[int]]:
    if isinstance(topk_ids, torch.Tensor):
        return [[int(v) for v in row] for row in topk_ids.tolist()]
    return [list(r) for r in topk_ids]


def _local(expert: int, expert_map: Sequence[int] | None) -> int:
    return expert if expert_map is None else expert_map[expert]


def naive_blocks(topk_ids: IdRows, expert_map: Sequence[int] | None = None) -> list[int]:
    """Local expert id of each row block on the naive path: one per (token, expert) pair."""
    return [_local(e, expert_map) for row in _rows(topk_ids) for e in row]


def sorted_blocks(topk_ids: IdRows, block_m: int, expert_map: Sequence[int] | None = None) -> list[int]:
    """Local expert id of each row block on the sorted path, in expert order.

    Experts with no pairs get no block; remote experts (map value -1) keep their
    blocks (the kernel skips their reads but the grid still covers them).
    """
    if block_m < 1:
        raise ValueError(f"block_m={block_m} < 1")
    counts = Counter(e for row in _rows(topk_ids) for e in row)
    blocks: list[int] = []
    for expert in sorted(counts):
        blocks.extend([_local(expert, expert_map)] * -(-counts[expert] // block_m))
    return blocks


@dataclass(frozen=True)
class ExpertBytes:
    """Bytes of one expert's weights, split by tensor so placements can be priced."""

    w13: int
    w2: int

    @classmethod
    def of_case(cls, case: MoECase) -> ExpertBytes:
        """Per-expert bytes for a case's weight layout (wNa16 scales excluded: they are small)."""
        s1, s2 = weight_shapes(case)
        if case.quant is None:
            elt = torch.empty((), dtype=torch_dtype(case.dtype)).element_size()
        else:
            elt = 1  # int8 and packed int4 are one byte per stored element
        return cls(w13=elt * s1[1] * s1[2], w2=elt * s2[1] * s2[2])

    def read(self, placement: Placement | None = None) -> int:
        """Bytes one block reads: both tensors, or only the host-resident ones."""
        if placement is None:
            return self.w13 + self.w2
        return self.w13 * placement.w13_host + self.w2 * placement.w2_host


def step_bytes(blocks: Iterable[int], per_expert: ExpertBytes, placement: Placement | None = None) -> int:
    """Expert-weight bytes a step with these row blocks reads (host bytes only if ``placement``)."""
    return sum(per_expert.read(placement) for e in blocks if e >= 0)


def reads_per_expert(blocks: Iterable[int]) -> dict[int, int]:
    """How many times each local expert's weights are read in one step."""
    return dict(Counter(e for e in blocks if e >= 0))


@dataclass(frozen=True)
class StepTraffic:
    """Both paths' bytes for one routing, and their ratio (what the naive path costs extra)."""

    naive: int
    sorted: int

    @property
    def ratio(self) -> float:
        return self.naive / self.sorted if self.sorted else float("nan")


def step_traffic(
    topk_ids: IdRows,
    per_expert: ExpertBytes,
    block_m: int,
    expert_map: Sequence[int] | None = None,
    placement: Placement | None = None,
) -> StepTraffic:
    return StepTraffic(
        naive=step_bytes(naive_blocks(topk_ids, expert_map), per_expert, placement),
        sorted=step_bytes(sorted_blocks(topk_ids, block_m, expert_map), per_expert, placement),
    )
