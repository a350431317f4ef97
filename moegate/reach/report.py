"""The reach report's page and JSON: ``results/reach.md`` and ``results/reach.json.xz``, from one evaluation.

The page says what was measured (each run: tiers, device, profile, command), the verdict (the problems,
or none; what is not measured yet), every census requirement with its status, the branches file by
file (exercised, not exercised by reason kind, not exercised without a reason, each of the last listed
with its line and the code it tests), every Triton variant compiled, every condition, and the reasons
in use. The JSON holds all of it: ``branches`` maps ``FILE::QUALNAME`` of a reached function to its arcs
``[from, to, taken, reason]`` (the reason's number in ``reach/reasons.toml``, or null), of a function no run
reached to its untaken branches counted by reason (``"none"``: without one; each arc is in the records, so the
committed JSON stays small); the source line each branch leaves is in the measured records (``results/reach/``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from moegate.reach.evaluate import Evaluation, ItemStatus
from moegate.reach.reasons import KINDS

COMMAND = "python -m moegate.reach report"
BRANCH_COLUMNS = ("branches", "exercised", "hardware", "scope", "census", "none")
LISTED = 12
"""Unreasoned untaken branches the page lists per function (the JSON lists all)."""


def _status(s: ItemStatus) -> str:
    if s.exercised:
        return f"exercised ({s.evidence})" if s.evidence else "exercised"
    if s.exercised is None:
        return "not measured: " + ("its reason: " + s.reason.cite if s.reason else "needs the kernel tier's GPU run")
    if s.reason is not None:
        return f"not exercised: {s.reason.cite}"
    return f"**NOT EXERCISED, no reason** ({s.evidence})"


def _verdict(ev: Evaluation) -> list[str]:
    lines = ["## Verdict", ""]
    if ev.problems:
        lines.append(
            f"**FAIL**: {len(ev.problems)} problem(s), each a census requirement or a reached branch not exercised "
            "and without a reviewed reason, or a reason that does not hold:"
        )
        lines += [""] + [f"- {p}" for p in ev.problems[:200]]
        if len(ev.problems) > 200:
            lines.append(f"- ... and {len(ev.problems) - 200} more (reach.json: `problems`)")
    else:
        lines.append(
            "**PASS**: every census requirement of the measured tiers is exercised or has a reviewed reason, "
            "and so is every branch judged."
        )
    if ev.pending:
        lines += ["", f"**Not measured**: {len(ev.pending)} requirements of the kernel tier (`not measured` below): "]
        lines[-1] += "`lab/gpu/reach.sh` measures them on a GPU, then the command above folds its record in."
    if not ev.complete:
        lines += ["", "Until every tier is measured, branches are judged in the decision's functions only: "]
        lines[-1] += "the rest of a reached function may be the kernel tier's to run."
    return lines + [""]


def _branches(ev: Evaluation) -> list[str]:
    by_file: dict[str, Counter[str]] = {}
    unreasoned: dict[str, list[str]] = {}
    for key, rows in ev.arcs.items():
        rel = key.split("::")[0]
        c = by_file.setdefault(rel, Counter())
        fn = ev.measured.functions[key]
        c["functions"] += 1
        c["reached"] += bool(fn["executed"])
        for a, b, taken, reason in rows:
            c["branches"] += 1
            if taken:
                c["exercised"] += 1
            elif reason is not None:
                c[reason.kind] += 1
            else:
                c["none"] += 1
                unreasoned.setdefault(key, []).append(f"{a} -> {b} `{fn['text'].get(str(a), '')}`")
    total: Counter[str] = sum(by_file.values(), Counter())
    lines = [
        "## Branches",
        "",
        f"{total['branches']} branches in {total['functions']} functions ({total['reached']} reached); exercised "
        f"{total['exercised']}; not exercised: "
        + ", ".join(f"{total[k]} {KINDS[k]}" for k in KINDS)
        + f", {total['none']} without a reason. `@triton.jit` kernels ({len(ev.measured.triton)}) are compiled, not "
        "run by Python: their variants are under Specialisations.",
        "",
        "| file | functions (reached) | branches | exercised | hardware | scope | census | no reason |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for rel, c in sorted(by_file.items()):
        if not c["branches"]:
            continue
        cells = [f"`{rel}`", f"{c['functions']} ({c['reached']})", *(str(c[k]) for k in BRANCH_COLUMNS)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "### Not exercised, without a reason", ""]
    if not unreasoned:
        lines.append("None.")
    for key, arcs in sorted(unreasoned.items()):
        more = f"; and {len(arcs) - LISTED} more" if len(arcs) > LISTED else ""
        reached = "reached" if ev.measured.functions[key]["executed"] else "not reached"
        lines.append(f"- `{key}` ({reached}, {len(arcs)}): " + "; ".join(arcs[:LISTED]) + more)
    return lines + [""]


def _specialisations(ev: Evaluation) -> list[str]:
    """One row a kernel: its variants summed up (each variant is in the JSON's ``specialisations``).

    A row per variant made the page 120 KB for one GPU run's 215 variants; the summary keeps what a reader
    checks against the requirements: each flag's values and which parameters were specialised in all, some or
    none of the variants.
    """
    lines = ["## Specialisations", ""]
    specs = ev.measured.specialisations
    if specs is None:
        return lines + ["Not measured: no run compiled the kernel tier's Triton kernels (a CUDA GPU).", ""]
    lines += [
        (
            f"{len(specs)} Triton kernel variants compiled (tuning values left out; each one in `reach.json.xz`, "
            "`specialisations`). Per kernel: each flag's values over its variants, and the parameters Triton "
            "specialised as divisible by 16 (or equal to 1) in every variant or in some only:"
        ),
        "",
        "| kernel | variants | flags (values seen) | divisible by 16: in all | in some | equal to 1: in some |",
        "| --- | ---: | --- | --- | --- | --- |",
    ]
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    for v in specs:
        by_kernel.setdefault(v["kernel"], []).append(v)
    for kernel, vs in sorted(by_kernel.items()):
        values: dict[str, set[str]] = {}
        for v in vs:
            for k, x in v["flags"].items():
                values.setdefault(k, set()).add(str(x))
        flags = "; ".join(f"{k}={'/'.join(sorted(x))}" for k, x in sorted(values.items()))
        div = [set(v["divisible"]) for v in vs]
        every, some = set.intersection(*div), set.union(*div)
        ones = set().union(*(v.get("ones", []) for v in vs))
        cells = [f"`{kernel}`", str(len(vs)), flags, ", ".join(sorted(every)), ", ".join(sorted(some - every)),
                 ", ".join(sorted(ones))]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _conditions(ev: Evaluation) -> list[str]:
    lines = ["## Conditions", ""]
    conds = ev.measured.conditions
    if conds is None:
        return lines + ["Not measured: no run checked kernel-tier cases against the reference (a CUDA GPU).", ""]
    lines += [
        "| condition | cases it applied to | cases it mattered in | first such case |",
        "| --- | ---: | ---: | --- |",
    ]
    for name, c in conds.items():
        ex = c.get("example")
        shown = f"{ex['entrypoint']}: `{ex['case']}`" if ex else ""
        lines.append(f"| {name} | {c['applied']} | {c['mattered']} | {shown} |")
    return lines + [""]


def render_markdown(ev: Evaluation, census: str) -> str:
    m = ev.measured
    lines = [
        f"# What the tiers exercise: vLLM {m.vllm}",
        "",
        (
            f"Regenerate: `{COMMAND}` (reads the measured records in `results/reach/`, the census `{census}` and the "
            "reviewed reasons `reach/reasons.toml`; docs/design/reach.md). Measured by `python -m moegate.reach run` "
            "(`nox -s reach`; on a GPU `lab/gpu/reach.sh`)."
        ),
        "",
        "| record | tiers | device | profile | Triton | coverage.py | pytest exit | seconds |",
        "| --- | --- | --- | --- | --- | --- | ---: | ---: |",
    ]
    for r in m.runs:
        status = f"{r['pytest_exit']}{' (stopped by its budget)' if r.get('stopped_by_budget') else ''}"
        cells = [f"`{r.get('file', '?')}`", "+".join(r["tiers"]), r["device"], r["profile"], r.get("triton"),
                 r.get("coverage"), status, r["seconds"]]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    failed = [r.get("file", "?") for r in m.runs if r["pytest_exit"] != 0]
    if failed:
        lines += ["", f"The tiers did not pass in {', '.join(failed)} (pytest's exit above): it measures what ran."]
    lines += [""] + _verdict(ev)
    lines += ["## Census requirements", "", "| feature(s) | requirement | tier | status |", "| --- | --- | --- | --- |"]
    for s in ev.items:
        by = ", ".join(s.required_by[:3]) + (f" (+{len(s.required_by) - 3})" if len(s.required_by) > 3 else "")
        lines.append(f"| {by} | {s.item.kind} `{s.item.key}` | {s.item.tier} | {_status(s)} |")
    lines += [""] + _branches(ev) + _specialisations(ev) + _conditions(ev)
    used = [r for r in ev.reasons if r in ev.used]
    lines += ["## Reasons in use", ""] + [f"- #{r.index} {r.kind}: {r.why}" for r in used] + [""]
    return "\n".join(lines)


def to_json(ev: Evaluation, census: str) -> dict[str, Any]:
    m = ev.measured
    return {
        "vllm": m.vllm,
        "census": census,
        "command": COMMAND,
        "runs": m.runs,
        "tiers": sorted(m.tiers),
        "verdict": "FAIL" if ev.problems else "PASS",
        "problems": ev.problems,
        "pending": ev.pending,
        "requirements": [
            {
                "kind": s.item.kind,
                "key": s.item.key,
                "tier": s.item.tier,
                "required_by": s.required_by,
                "exercised": s.exercised,
                "evidence": s.evidence,
                "reason": s.reason.index if s.reason else None,
            }
            for s in ev.items
        ],
        "branches": {key: _branch_json(bool(m.functions[key]["executed"]), rows) for key, rows in ev.arcs.items()},
        "triton_kernels": m.triton,
        "specialisations": m.specialisations,
        "conditions": m.conditions,
        "reasons": [{"index": r.index, "kind": r.kind, "why": r.why} for r in ev.reasons],
    }


def _branch_json(reached: bool, rows: list[tuple[int, int, bool, Any]]) -> dict[str, Any]:
    """A reached function's arcs ``[from, to, taken, reason]``; an unreached one's untaken count by reason."""
    if reached:
        return {"reached": True, "arcs": [[a, b, int(t), r.index if r else None] for a, b, t, r in rows]}
    return {"reached": False, "untaken": dict(Counter(str(r.index) if r else "none" for *_, r in rows))}


def write_bytes(path: Path, data: bytes) -> None:
    """Write whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
