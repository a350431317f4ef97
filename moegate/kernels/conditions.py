"""Which of the torch reference's conditions a kernel-tier case made matter.

A condition is a part of the layer's definition that a kernel can get wrong while everything else
stays right: a clamp, a bias, the router weight on the input, the expert map, the wNa16 zero point,
the tail of K a kernel block does not divide, the 64-bit row index past ``2**31``
(``CONDITIONS``). A case runs the code of a condition without telling anything when its result is the
same without it: a clamp whose limit no input reaches, a bias of zero, a router weight of exactly 1,
a K every block divides. So for each case the kernel tier checks, ``mattered`` evaluates the
reference again without each condition that applies (``reference_moe(without=...)``) and asks the
tier's own question of that result: is it outside the tolerance of the reference with the
condition? If so, a kernel that left the condition out would have failed this case: it mattered.

The 64-bit row index is decided on the tokens past the boundary alone: without it, the rows of every token
whose pair offset passes ``2**31`` (``moegate.core.index_width``) are written elsewhere, so it matters
when such a token's reference output is not zero within the tolerance.

``Tally`` counts, per condition, the cases it applied to and those it mattered in, and keeps the
first case it mattered in as a reproducer. The reach run (``moegate.reach.plugin``) installs one as a
kernel-tier observer (``moegate.kernels.check.OBSERVERS``); CI never does: it costs a reference per
condition and case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from moegate.core.case import MoECase
from moegate.core.index_width import INT32_LIMIT, kernel_extent, row_width
from moegate.core.tensors import CaseTensors, torch_dtype
from moegate.kernels import activations
from moegate.kernels import reference as ref_mod
from moegate.kernels.check import reference_for
from moegate.kernels.reference import Reference
from moegate.kernels.tolerance import compare

INDEX_BOUNDARY = "64-bit row index"
CONDITIONS: tuple[str, ...] = (*activations.CONDITIONS, *ref_mod.LAYER_CONDITIONS, INDEX_BOUNDARY)
"""Every condition the reference implements, in the report's order."""


def applicable(case: MoECase, block_k: tuple[int, int] | None = None) -> tuple[str, ...]:
    """The ``CONDITIONS`` that are part of ``case``'s definition (``block_k``: the launches' BLOCK_SIZE_K)."""
    out = list(activations.conditions(case.activation))
    if case.bias:
        out += [ref_mod.W13_BIAS, ref_mod.W2_BIAS]
    if case.apply_router_weight_on_input:
        out.append(ref_mod.ON_INPUT)
    if case.expert_map is not None:
        out.append(ref_mod.EXPERT_MAP)
    if case.quant is not None and case.quant.weight_only and case.quant.group_size > 0:
        out.append(ref_mod.ZERO_POINT)
    if block_k is not None and _has_tail(case, block_k):
        out.append(ref_mod.K_TAIL)
    if kernel_extent(case) > INT32_LIMIT:
        out.append(INDEX_BOUNDARY)
    return tuple(out)


def _has_tail(case: MoECase, block_k: tuple[int, int]) -> bool:
    first, second = block_k
    return bool((first and case.hidden % first) or (second and case.intermediate % second))


def _index_boundary_matters(case: MoECase, t: CaseTensors) -> bool:
    """Without the 64-bit row index the tokens past the boundary are written elsewhere: does any of them have an
    output the tolerance can tell from nothing? Only those tokens are computed (a call there holds 262,144)."""
    # pair p's row ends at offset (p + 1) * width - 1: past 2**31 - 1 from p = 2**31 // width on
    first_bad = (INT32_LIMIT // row_width(case)) // case.topk_columns  # the first token holding such a pair
    if first_bad >= case.num_tokens:
        return False
    past = replace(
        t,
        hidden_states=t.hidden_states[first_bad:],
        topk_weights=t.topk_weights[first_bad:],
        topk_ids=t.topk_ids[first_bad:],
    )
    ref = reference_for(case, past, frozenset(), None)
    return not compare(torch.zeros_like(ref.output), ref, torch_dtype(case.dtype), case.quant, case.activation).ok


def mattered(
    case: MoECase, t: CaseTensors, block_k: tuple[int, int] | None = None, ref: Reference | None = None
) -> dict[str, bool]:
    """For each condition that applies to ``case``: would the tier's check have told a result without it?"""
    dtype = torch_dtype(case.dtype)
    out: dict[str, bool] = {}
    conditions = applicable(case, block_k)
    if INDEX_BOUNDARY in conditions:
        out[INDEX_BOUNDARY] = _index_boundary_matters(case, t)
    others = [c for c in conditions if c != INDEX_BOUNDARY]
    if others:
        ref = ref if ref is not None else reference_for(case, t, frozenset(), block_k)
        for name in others:
            without = reference_for(case, t, frozenset({name}), block_k)
            out[name] = not compare(without.output, ref, dtype, case.quant, case.activation).ok
    return out


@dataclass
class Count:
    applied: int = 0
    mattered: int = 0
    example: dict[str, Any] | None = None  # the first case it mattered in, with its entrypoint

    def to_dict(self) -> dict[str, Any]:
        return {"applied": self.applied, "mattered": self.mattered, "example": self.example}


@dataclass
class Tally:
    """Per condition: cases it applied to, cases it mattered in, the first of those (module docstring)."""

    counts: dict[str, Count] = field(default_factory=lambda: {name: Count() for name in CONDITIONS})
    errors: list[str] = field(default_factory=list)

    def add(self, case: MoECase, entrypoint: str, seen: Mapping[str, bool]) -> None:
        for name, matters in seen.items():
            count = self.counts.setdefault(name, Count())
            count.applied += 1
            if matters:
                count.mattered += 1
                if count.example is None:
                    count.example = {"entrypoint": entrypoint, "case": case.to_dict()}

    def observe(self, result: Any) -> None:
        """A ``moegate.kernels.check.OBSERVERS`` entry: one checked kernel call."""
        if result.tensors is None:
            return
        try:
            seen = mattered(result.case, result.tensors, result.block_k)
        except Exception as exc:  # noqa: BLE001 - the tier's own verdict must not depend on the report's
            self.errors.append(f"{result.case.short()}: {type(exc).__name__}: {exc}")
            return
        self.add(result.case, result.entrypoint, seen)

    def to_dict(self) -> dict[str, Any]:
        return {"counts": {k: v.to_dict() for k, v in self.counts.items()}, "errors": self.errors}
