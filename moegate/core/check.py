"""The one assertion the dispatch tier makes, with a failure message that is a reproducer."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Protocol

from moegate.core.case import MoECase
from moegate.core.spec import expected_path, experts_counted

MARK = "MOEGATE-MISMATCH"
_MARK_RE = re.compile(MARK + r" (\{.*\})")


class Observer(Protocol):
    def run(self, case: MoECase, entrypoint: str) -> Any: ...


class DispatchMismatch(AssertionError):
    """The path an entrypoint took is not the one the spec requires."""


EXAMPLE_PREFIX = "pin it: "
DEV_VARIABLE = "MOEGATE_DEV"
"""Set (to anything but ``0``) in moegate's own development runs: the nox sessions of its test command."""


def dev_run() -> bool:
    """Whether this is one of moegate's own development runs, where a failure also prints its ``@example`` line.

    A vLLM developer's gate gets the reproducer only: the ``@example`` line is for moegate's strategies, which a
    pull request to vLLM does not edit."""
    return os.environ.get(DEV_VARIABLE, "") not in ("", "0")


def _example(case: MoECase) -> str:
    return f"\n  {example_line(case)}" if dev_run() else ""


def example_line(case: MoECase) -> str:
    """A line to paste above the failing test: ``@example(case=MoECase.from_dict({...}))``.

    The nightly job collects these (the ``pin it:`` prefix) into its summary; the
    test module needs ``from hypothesis import example`` and ``from moegate.core.case import MoECase``.
    """
    return f"{EXAMPLE_PREFIX}@example(case=MoECase.from_dict({case.to_dict()!r}))"


def mismatch_record(case: MoECase, entrypoint: str, observed: str) -> dict[str, Any]:
    want = expected_path(case, entrypoint)
    return {
        "entrypoint": entrypoint,
        "placement": case.placement.label,
        "tokens": case.num_tokens,
        "top_k": case.top_k,
        "experts": case.num_experts,
        "expected": want.path.value,
        "observed": observed,
        "reason": want.reason,
        "case": case.to_dict(),
    }


def assert_path(target: Observer, case: MoECase, entrypoint: str) -> str:
    """Run ``case`` through ``entrypoint`` and fail unless the observed path is the spec's."""
    obs = target.run(case, entrypoint)
    observed = obs.path
    want = expected_path(case, entrypoint)
    if observed != want.path.value:
        rec = mismatch_record(case, entrypoint, observed)
        raise DispatchMismatch(
            f"{entrypoint} entrypoint took {observed}, spec requires {want} for {case.short()}\n"
            f"  reproduce: python -m moegate repro '{case.to_json()}'{_example(case)}\n"
            f"{MARK} {json.dumps(rec, sort_keys=True)}"
        )
    _assert_assignment(obs, case, entrypoint)
    return observed


def _assert_assignment(obs: Any, case: MoECase, entrypoint: str) -> None:
    """Past the path: what the alignment is handed, and the naive assignment itself.

    Sorted: every ``moe_align_block_size`` call gets the count the entrypoint must
    count by (global with an expert map, else ``w1.shape[0]``, fused shared rows
    included either way), the case's expert map (shared rows local), every id of the
    call (``tokens * (top_k + shared)``: the call is not cut into chunks) and the block
    size of the kernel config the launches get (the kernel walks the alignment's
    blocks). Naive: the kernel gets one block per (token, expert) pair:
    ``expert_ids`` is the flattened ``topk_ids`` and ``num_tokens_post_padded`` is
    ``[pairs * BLOCK_SIZE_M]``.
    """
    problems = []
    want_count = experts_counted(case, entrypoint)
    for n in getattr(obs, "align_num_experts", []):
        if n != want_count:
            problems.append(f"moe_align_block_size got num_experts={n}, spec counts {want_count}")
    for n in getattr(obs, "align_id_counts", []):
        if n != case.pairs:
            problems.append(f"moe_align_block_size got {n} ids, the call has {case.pairs} (tokens * ids per token)")
    launch_blocks = {launch.block_m for launch in getattr(obs, "launches", []) if getattr(launch, "block_m", 0)}
    for b in getattr(obs, "align_block_sizes", []):
        if launch_blocks and launch_blocks != {b}:
            problems.append(
                f"moe_align_block_size got block size {b}, the kernel launches BLOCK_SIZE_M {launch_blocks}"
            )
    want_map = case.expert_map_list()
    for got in getattr(obs, "align_expert_maps", []):
        if got is not None and got != want_map:
            problems.append(
                f"moe_align_block_size got expert map {got[:16]}..., the case's is {(want_map or [])[:16]}..."
            )
        if got is None and want_map is not None and not getattr(obs, "completed", False):
            problems.append("moe_align_block_size got no expert map, the case has one")
    naive = getattr(obs, "naive_assignments", [])
    flat = [e for row in case.topk_ids() for e in row] if naive else []
    for ids, ntpp, block_m in naive:
        if ids != flat:
            problems.append(f"naive expert_ids {ids[:16]} != flattened topk_ids {flat[:16]}")
        if ntpp != [case.pairs * block_m]:
            problems.append(f"naive num_tokens_post_padded {ntpp} != [{case.pairs}*{block_m}]")
    if problems:
        raise DispatchMismatch(
            f"{entrypoint} entrypoint: wrong expert assignment for {case.short()}: {'; '.join(problems)}\n"
            f"  reproduce: python -m moegate repro '{case.to_json()}'{_example(case)}"
        )


def parse_mismatches(text: str) -> list[dict[str, Any]]:
    """Every mismatch record in a log or report (used by the meta-check)."""
    return [json.loads(m.group(1)) for m in _MARK_RE.finditer(text)]
