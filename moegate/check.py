"""The one assertion the dispatch tier makes, with a failure message that is a reproducer."""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from moegate.case import MoECase
from moegate.spec import expected_path

MARK = "MOEGATE-MISMATCH"
_MARK_RE = re.compile(MARK + r" (\{.*\})")


class Observer(Protocol):
    def run(self, case: MoECase, entrypoint: str) -> Any: ...


class DispatchMismatch(AssertionError):
    """The path an entrypoint took is not the one the spec requires."""


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
    observed = target.run(case, entrypoint).path
    want = expected_path(case, entrypoint)
    if observed != want.path.value:
        rec = mismatch_record(case, entrypoint, observed)
        raise DispatchMismatch(
            f"{entrypoint} entrypoint took {observed}, spec requires {want} for {case.short()}\n"
            f"  reproduce: python -m moegate repro '{case.to_json()}'\n"
            f"{MARK} {json.dumps(rec, sort_keys=True)}"
        )
    return observed


def parse_mismatches(text: str) -> list[dict[str, Any]]:
    """Every mismatch record in a log or report (used by the meta-check)."""
    return [json.loads(m.group(1)) for m in _MARK_RE.finditer(text)]
