"""Every dispatch site: each caller of the assignment decision and of the alignment, classified under the spec.

A site is a call of ``_prepare_expert_assignment`` (the naive/sorted decision) or of an
aligner (``moe_align_block_size``, ``batched_moe_align_block_size``) anywhere in vLLM,
except an aligner's own wrapper around its op. Each is classified by what its code
does, under docs/spec.md's rule that host-resident weights take the sorted path:

- ``the decision``: the alignment call inside the decision itself;
- ``host-resident takes sorted``: calls the decision with ``weights_host_resident`` computed
  by vLLM's residency check over the call's weights;
- ``always aligns``: calls an aligner on every path through its function and never the
  decision (Marlin, the wNa16 Triton experts, the emulation and backend experts);
- a reviewed classification from ``moegate.census.reviewed`` for a site the rules above
  cannot settle (a decision without the host flag, an alignment on some paths only),
  with its reason; an exception is a site allowed to keep the naive path for
  host-resident weights;
- ``unreviewed``: anything else. A new caller, or a caller whose call changed, shows
  in the census diff and, until reviewed, fails the dispatch tier.

Each record keeps the arguments that decide what alignment is handed (the expert
count, the expert map, the block size or kernel config, whether invalid experts
are dropped) as source text, so a change to any of them is a census change.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from moegate.census.reviewed import REVIEWED
from moegate.census.source import CensusError, VllmSource
from moegate.census.syntax import ScopedCall, conditional, parse, read, scoped_calls
from moegate.dispatch import names

DECISION = names.PREPARE_EXPERT_ASSIGNMENT
ALIGNERS = (names.MOE_ALIGN_BLOCK_SIZE, "batched_moe_align_block_size")
CALLEES = frozenset((DECISION, *ALIGNERS))
DEFINED_IN = {
    DECISION: "model_executor/layers/fused_moe/fused_moe.py",
    names.MOE_ALIGN_BLOCK_SIZE: "model_executor/layers/fused_moe/moe_align_block_size.py",
    "batched_moe_align_block_size": "model_executor/layers/fused_moe/moe_align_block_size.py",
}
HOST_FLAG = "weights_host_resident"

RULE_DECISION = "the decision"
RULE_HOST = "host-resident takes sorted"
RULE_ALIGNS = "always aligns"
RULE_EXCEPTION = "exception"
RULE_UNREVIEWED = "unreviewed"
ACCEPTED = frozenset({RULE_DECISION, RULE_HOST, RULE_ALIGNS, RULE_EXCEPTION})
"""Classifications that satisfy the spec; ``unreviewed`` does not."""

# what each callee's arguments are recorded as: record key -> parameter name in the callee
RECORDED = {
    DECISION: {"experts": "global_num_experts", "expert_map": "expert_map", "config": "config"},
    names.MOE_ALIGN_BLOCK_SIZE: {"experts": "num_experts", "expert_map": "expert_map", "block_size": "block_size"},
    "batched_moe_align_block_size": {"block_size": "block_size", "experts": "expert_num_tokens"},
}
FLAGS = ("ignore_invalid_experts", HOST_FLAG)


def callee_params(src: VllmSource) -> dict[str, list[str]]:
    """Each callee's parameters in order, read from its definition (a missing definition is a ``CensusError``)."""
    out: dict[str, list[str]] = {}
    for name, rel in DEFINED_IN.items():
        path = src.path(rel)
        if not path.is_file():
            raise CensusError(f"census: cannot find where vLLM defines {name}: looked for {path}")
        for node in parse(path).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                a = node.args
                out[name] = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
        if name not in out and name == DECISION:
            raise CensusError(f"census: vLLM's assignment decision {name} is not defined in {path}")
    return out


def _arg(call: ast.Call, param: str, params: list[str]) -> str | None:
    for kw in call.keywords:
        if kw.arg == param:
            return ast.unparse(kw.value)
    if param in params:
        i = params.index(param)
        positional = [a for a in call.args if not isinstance(a, ast.Starred)]
        if i < len(positional) and len(positional) == len(call.args):
            return ast.unparse(positional[i])
    return None


def _computes_residency(flag: str | None) -> bool:
    return flag is not None and f"{names.WEIGHTS_HOST_RESIDENT}(" in flag


def classify(rec: dict[str, Any], scope_calls_decision: bool) -> tuple[str, str]:
    """(rule, reason) for a site record (the module docstring's order)."""
    key = f"{rec['file']}::{rec['scope']}"
    if rec["callee"] in ALIGNERS and rec["scope"].split(".")[-1] == DECISION:
        return (
            RULE_DECISION,
            "docs/spec.md: aligns outside the naive region, for an expert map, grouped wNa16 and host residency",
        )
    if rec["callee"] == DECISION and _computes_residency(rec.get(HOST_FLAG)):
        return RULE_HOST, f"passes {HOST_FLAG}={rec[HOST_FLAG]}"
    if rec["callee"] in ALIGNERS and not rec["conditional"] and not scope_calls_decision:
        return RULE_ALIGNS, "aligns on every path and never calls the decision"
    review = REVIEWED.get(key)
    if review is not None:
        return review
    if rec["callee"] == DECISION:
        return RULE_UNREVIEWED, f"calls the decision without {HOST_FLAG} from the weights: review it (reviewed.py)"
    return RULE_UNREVIEWED, "aligns on some paths only: review it (reviewed.py)"


def find_sites(src: VllmSource, files: list[Path], params: dict[str, list[str]]) -> list[dict[str, Any]]:
    """One record per site in ``files``, classified; ``params``: ``callee_params(src)``."""
    records: list[dict[str, Any]] = []
    for file in files:
        text = read(file)
        if not any(c in text for c in CALLEES):
            continue
        calls = [
            sc for sc in scoped_calls(parse(file), CALLEES) if sc.scope.split(".")[-1] not in ALIGNERS
        ]  # an aligner's own wrapper around its op is the aligner, not a caller
        decision_scopes = {sc.scope for sc in calls if sc.call.func and _name(sc.call) == DECISION}
        seen: dict[tuple[str, str], int] = {}
        for sc in calls:
            name = _name(sc.call)
            if name == DECISION and src.rel(file) == DEFINED_IN[DECISION] and sc.scope.split(".")[-1] == DECISION:
                continue
            rec: dict[str, Any] = {"kind": "site", "file": src.rel(file), "scope": sc.scope, "callee": name}
            for key, param in RECORDED[name].items():
                rec[key] = _arg(sc.call, param, params.get(name, []))
            for flag in FLAGS:
                if flag in params.get(name, []):
                    rec[flag] = _arg(sc.call, flag, params[name])
            rec["conditional"] = conditional(sc)
            counted = _local_value(sc, rec.get("experts"))
            if counted is not None:
                rec["experts_is"] = counted  # how the count handed over is computed (shared rows, EP)
            n = seen[(sc.scope, name)] = seen.get((sc.scope, name), 0) + 1
            if n > 1:
                rec["scope"] = f"{sc.scope}#{n}"
            rec["rule"], rec["reason"] = classify(rec, sc.scope in decision_scopes)
            records.append(rec)
    if not any(r["callee"] == DECISION for r in records):
        raise CensusError(
            f"census: found no caller of vLLM's assignment decision {DECISION} under {src.root}: "
            "the two entrypoints (fused_experts_impl, TritonExperts.apply) call it"
        )
    return records


def _local_value(sc: ScopedCall, name: str | None) -> str | None:
    """The expression a local variable passed as an argument was assigned (the last assignment before the call)."""
    if name is None or not name.isidentifier() or sc.function is None:
        return None
    found = None
    for stmt in ast.walk(sc.function):
        if (
            isinstance(stmt, ast.Assign)
            and stmt.lineno < sc.call.lineno
            and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
        ):
            found = ast.unparse(stmt.value)
    return found


def _name(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
