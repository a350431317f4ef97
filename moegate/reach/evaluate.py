"""The reach report's judgement: every branch, specialisation and condition, exercised or not and why.

Inputs: the measured records of one or more reach runs (``moegate.reach.run``: the dispatch tier on a
CPU, both tiers on a GPU), the census records of the release they measured, the reviewed reasons.
``combine`` joins the runs (one vLLM release); ``evaluate`` gives each thing its status:

- a branch: taken by some run, or not taken with the first reason covering it, or with none;
- a required item (``moegate.reach.requirements``): exercised, or not with its reason, or with none, or
  *not measured* when no run measured its tier (the kernel tier needs a GPU).

What makes the report fail (``problems``), each one line:

1. a census requirement of a measured tier not exercised and without a reason;
2. a branch not taken and without a reason, in any function the tiers reached once every tier was
   measured (a function a census configuration runs, whose other arm no case takes), and, with the
   dispatch tier alone, in the decision's own functions (``DECISION``: the rest of a reached function may
   be the kernel tier's to run);
3. a ``census`` reason the census contradicts (a record matches what it says is absent);
4. a reason that covers nothing listed (a typo, or code that moved: it would hide nothing, silently).

``pending`` lists the required items no run measured: the report says so instead of judging them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from moegate.reach import branches as br
from moegate.reach.reasons import Reason, contradicted, first
from moegate.reach.requirements import FM, Item, required, specialised
from moegate.reach.run import TIERS

DECISION = (f"{FM}::_prepare_expert_assignment", f"{FM}::_weights_host_resident")
"""Functions whose every branch the dispatch tier alone must take (the decision the power run mutates)."""


class MeasuredError(ValueError):
    """Measured records that cannot be joined into one report; the message is one line."""


@dataclass
class Measured:
    """The runs' records joined: what any of them exercised."""

    vllm: str
    runs: list[dict[str, Any]]  # each run's metadata (its record less the measurements)
    tiers: set[str]
    functions: br.Functions
    triton: list[str]
    specialisations: list[dict[str, Any]] | None  # None: no run compiled the kernel tier's variants
    conditions: dict[str, dict[str, Any]] | None  # None: no run checked kernel-tier cases


MEASUREMENTS = ("functions", "triton_kernels", "specialisations", "conditions")


def combine(records: Sequence[Mapping[str, Any]]) -> Measured:
    if not records:
        raise MeasuredError("reach: no measured record to report (python -m moegate.reach run writes one)")
    versions = sorted({r["vllm"] for r in records})
    if len(versions) > 1:
        raise MeasuredError(f"reach: the records measure different vLLM releases ({', '.join(versions)}): one a report")
    specs: dict[str, dict[str, Any]] | None = None
    conds: dict[str, dict[str, Any]] | None = None
    for rec in records:
        if rec.get("specialisations") is not None:
            specs = specs or {}
            for v in rec["specialisations"]:
                specs[repr(sorted(v.items(), key=str))] = v
        if rec.get("conditions") is not None:
            conds = conds or {}
            for name, c in rec["conditions"].items():
                have = conds.setdefault(name, {"applied": 0, "mattered": 0, "example": None})
                have["applied"] += c["applied"]
                have["mattered"] += c["mattered"]
                have["example"] = have["example"] or c.get("example")
    return Measured(
        versions[0],
        [{k: v for k, v in r.items() if k not in MEASUREMENTS} for r in records],
        {t for r in records for t in r["tiers"]},
        br.merge(r["functions"] for r in records),
        sorted({k for r in records for k in r.get("triton_kernels", [])}),
        None if specs is None else [specs[k] for k in sorted(specs)],
        conds,
    )


@dataclass
class ItemStatus:
    item: Item
    required_by: list[str]
    exercised: bool | None  # None: not measured
    reason: Reason | None
    evidence: str = ""


@dataclass
class Evaluation:
    measured: Measured
    items: list[ItemStatus]
    arcs: dict[str, list[tuple[int, int, bool, Reason | None]]]
    problems: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)
    used: set[Reason] = field(default_factory=set)

    @property
    def complete(self) -> bool:
        """Every tier measured: the whole report is judged."""
        return set(TIERS) <= self.measured.tiers


def _item_status(item: Item, m: Measured) -> tuple[bool | None, str]:
    if item.tier not in m.tiers:
        return None, ""
    if item.kind == "function":
        fn = m.functions.get(item.key)
        return (fn is not None and br.reached(fn)), "" if fn is None else f"{len(fn['executed'])} lines ran"
    if item.kind == "specialisation":
        if m.specialisations is None:
            return None, ""
        hits = [v for v in m.specialisations if specialised(v, item.key)]
        return bool(hits), f"{len(hits)} variant(s)"
    if m.conditions is None:
        return None, ""
    count = m.conditions.get(item.key, {"applied": 0, "mattered": 0})
    return count["mattered"] > 0, f"mattered in {count['mattered']} of {count['applied']} cases it applied to"


def evaluate(m: Measured, records: Sequence[Mapping[str, Any]], reasons: Sequence[Reason]) -> Evaluation:
    ev = Evaluation(m, [], {}, reasons=list(reasons))
    for item, by in sorted(required(records).items(), key=lambda kv: (kv[0].tier, kv[0].kind, kv[0].key)):
        exercised, evidence = _item_status(item, m)
        reason = first(reasons, item=item.label)
        if reason is not None:
            ev.used.add(reason)
        ev.items.append(ItemStatus(item, by, exercised, reason, evidence))
        if exercised is None:
            ev.pending.append(f"{item.label} ({item.tier} tier: not measured)")
        elif not exercised and reason is None:
            ev.problems.append(f"not exercised, no reason: {item.label} (required by {', '.join(by)}; {evidence})")
    for key, fn in sorted(m.functions.items()):
        rel, _, qual = key.partition("::")
        rows = []
        for a, b, taken in fn["arcs"]:
            reason = first(reasons, branch=(rel, qual, fn["text"].get(str(a), "")))
            if reason is not None:
                ev.used.add(reason)
            rows.append((a, b, bool(taken), reason))
        ev.arcs[key] = rows
        judged = (ev.complete and br.reached(fn)) or key in DECISION
        for a, b, taken, reason in rows:
            if judged and not taken and reason is None:
                ev.problems.append(f"branch not taken, no reason: {key} line {a} -> {b}: {fn['text'].get(str(a), '')}")
    for reason in reasons:
        wrong = contradicted(reason, records)
        if wrong:
            first_hit = wrong[0]
            where = first_hit.get("file") or first_hit.get("name") or first_hit.get("dtype") or first_hit["kind"]
            ev.problems.append(
                f"reasons.toml #{reason.index} says the census lists no {dict(reason.absent)}, but it has {len(wrong)} "
                f"such record(s) ({first_hit['kind']} {where})"
            )
        if reason not in ev.used and (reason.where or reason.items):
            covers = any(reason.covers_item(s.item.label) for s in ev.items)
            covers = covers or any(
                reason.covers_branch(key.split("::", 1)[0], key.split("::", 1)[1], fn["text"].get(str(a), ""))
                for key, fn in m.functions.items()
                for a, _, _ in fn["arcs"]
            )
            if not covers:
                ev.problems.append(f"reasons.toml #{reason.index} covers nothing the report lists: {reason.why[:80]}")
    return ev
