"""The real-bug corpus's verdicts and its page: each bug killed, flagged or survived, and why.

A bug is **killed** when a behaviour test of the tiers run fails on its build (the first one, in run
order, is named with its tier), **flagged** when only review checks fail
(``moegate.power.corpus_stop.REVIEW_TESTS``: they hold vLLM's source text to a reviewed record),
**survived** when the gate passes. A survivor is *explained* by the corpus's reviewed reason
(``survives`` in ``power/real-bugs.toml``), or, in a run without the tier the corpus expects to kill
it, by that; any other survivor is *unexplained*, and the report fails. A build that did not reach a
verdict (no build, a timeout, the budget) is not judged and not scored. The score is killed over
judged; issue 45 asks 80 % of the GPU run (dispatch and kernels).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from moegate.power.corpus import Bug

TARGET = 0.80
SCORED = ("killed", "flagged", "survived")


def verdict(
    result: Mapping[str, Any], bug: Bug | None, tiers: str, base_fails: frozenset[str] = frozenset()
) -> tuple[str, str]:
    """(verdict, why) of one result: killed | flagged | survived | unexplained | not judged | not run | stale.

    ``base_fails``: the tests the run's unplanted build failed. A bug whose first failing test is one of them is
    not judged: that test fails without the bug (a gate stops at its first failure, so what came after is unknown).
    """
    status = result["status"]
    if status == "not-run":  # never started: nothing was planted, so nothing can be stale either
        return "not run", result.get("error", "")
    if bug is not None and result.get("fingerprint") != bug.fingerprint:
        return "stale", "the corpus re-plants it differently since this run: run it again"
    if status != "ran":
        return "not judged", result.get("error", "")
    failures = result.get("failures", [])
    behaviour = [f for f in failures if not f["review"]]
    if behaviour:
        first = behaviour[0]
        if first["nodeid"] in base_fails:
            return "not judged", f"its first failing test, `{first['nodeid']}`, fails on the unplanted build too"
        return "killed", f"{first['tier']}: `{first['nodeid']}`"
    if result.get("exit_code") == 1 and " diff FAIL " in f" {result.get('error', '')} ":
        return "killed", "diff: the differential tier, the bug's kernels against the baseline's on the same cases"
    if failures:
        return "flagged", "review only: " + ", ".join(f"`{f['nodeid']}`" for f in failures)
    if result.get("exit_code") != 0:
        return "not judged", f"gate exit {result.get('exit_code')} without a failing test: {result.get('error', '')}"
    if bug is None:
        return "survived", ""
    if bug.expect not in ("survives", *tiers.split(",")):
        return "survived", f"expected to die in the {bug.expect} tier, not run here"
    if bug.survives:
        return "survived", bug.survives
    return "unexplained", "survived with no reviewed explanation in the corpus"


def baseline_failures(summary: Mapping[str, Any]) -> frozenset[str]:
    """The tests the run's unplanted build failed (none where it passed)."""
    base = next((r for r in summary["results"] if r["id"] == "baseline"), None)
    return frozenset(f["nodeid"] for f in (base or {}).get("failures", []))


def tally(summary: Mapping[str, Any], bugs: Sequence[Bug]) -> Counter[str]:
    by_id, fails = {b.id: b for b in bugs}, baseline_failures(summary)
    return Counter(
        verdict(r, by_id.get(r["id"]), summary["tiers"], fails)[0] for r in summary["results"] if r["id"] != "baseline"
    )


def counts_line(counts: Mapping[str, int]) -> str:
    judged = sum(counts.get(k, 0) for k in (*SCORED, "unexplained"))
    killed = counts.get("killed", 0)
    pct = f"{100 * killed / judged:.0f} %" if judged else "n/a"
    parts = [f"**{killed} of {judged} killed by behaviour ({pct})**"]
    parts += [
        f"{counts[k]} {k}" for k in ("flagged", "survived", "unexplained", "not judged", "not run") if counts.get(k)
    ]
    return ", ".join(parts)


def baseline_ok(summary: Mapping[str, Any]) -> tuple[bool, str]:
    base = next((r for r in summary["results"] if r["id"] == "baseline"), None)
    if base is None:
        return False, "the baseline did not run"
    if base["status"] == "ran" and base.get("exit_code") == 0 and not base.get("failures"):
        return True, f"the unplanted build PASSes the same gate ({base['tests']} tests, {base['wall_s']:.0f} s)"
    return False, f"the unplanted build does not pass ({verdict(base, None, summary['tiers'])[1] or base['status']})"


def unexplained(summary: Mapping[str, Any], bugs: Sequence[Bug]) -> list[str]:
    """Bugs not killed whose survival nothing explains: unexplained survivors, flagged bugs without a reason, and
    results of a re-plant the corpus has since changed."""
    by_id, fails = {b.id: b for b in bugs}, baseline_failures(summary)
    out = []
    for r in summary["results"]:
        v = verdict(r, by_id.get(r["id"]), summary["tiers"], fails)[0] if r["id"] != "baseline" else ""
        if v in ("unexplained", "stale") or (v == "flagged" and not (r["id"] in by_id and by_id[r["id"]].survives)):
            out.append(r["id"])
    return out


def passed(summaries: Sequence[Mapping[str, Any]], bugs: Sequence[Bug]) -> bool:
    """Every baseline passes and every bug not killed is explained."""
    return all(baseline_ok(s)[0] and not unexplained(s, bugs) for s in summaries)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _section(summary: Mapping[str, Any], bugs: Sequence[Bug]) -> list[str]:
    by_id, fails = {b.id: b for b in bugs}, baseline_failures(summary)
    ok, base = baseline_ok(summary)
    lines = [
        f"## {summary['device']}: tiers {summary['tiers']}",
        "",
        counts_line(tally(summary, bugs)) + ("" if ok else " (**void**: the baseline fails)") + ".",
        "",
        f"- Baseline: {base}.",
        (
            f"- vLLM {summary['vllm_version']}, {summary.get('date', '')}, project at {summary.get('project_rev', '?')}; "
            f"corpus `{summary['corpus']}` (sha256 `{summary['corpus_sha256'][:16]}`)."
        ),
        *(
            [
                (
                    f"- Read again from each gate's log and JUnit report on {summary['rescanned']} "
                    "(`python -m moegate power corpus rescan`: nothing re-run)."
                )
            ]
            if summary.get("rescanned")
            else []
        ),
        f"- Command: `{summary['command']}`; {summary['jobs']} gate(s) at a time, budget {summary['budget_s']:.0f} s, "
        f"{summary['wall_s']:.0f} s in all; "
        + (
            "each gate stopped at its first failing behaviour test (a kill needs one; survivors run the whole gate)."
            if summary.get("stop_at_first_kill")
            else "every gate ran every test."
        ),
        "",
        "| bug | upstream | re-plant | expected | verdict | by | wall |",
        "| --- | --- | --- | --- | --- | --- | ---: |",
    ]
    why_rows = []
    for r in summary["results"]:
        if r["id"] == "baseline":
            continue
        bug = by_id.get(r["id"])
        v, why = verdict(r, bug, summary["tiers"], fails)
        where = ", ".join(dict.fromkeys(f"`{Path(e.file).name}::{e.scope}`" for e in bug.edits)) if bug else ""
        upstream = f"[#{bug.upstream.rsplit('#', 1)[-1]}]({bug.url})" if bug else ""
        by = why if v in ("killed", "flagged") else ""
        lines.append(
            f"| `{r['id']}` | {upstream} | {where} | {bug.expect if bug else ''} | **{v}** | {_cell(by)} | {r['wall_s']:.0f} s |"
        )
        if v == "flagged":  # not killed by behaviour: the corpus's reason is the explanation
            why = bug.survives if bug and bug.survives else "unexplained: no reviewed reason in the corpus"
        if v != "killed":
            why_rows.append((r["id"], v, why, r.get("skips", [])))
    if why_rows:
        lines += ["", "Every bug not killed, and why:", ""]
        for bug_id, v, why, skips in why_rows:
            lines.append(f"- `{bug_id}` ({v}): {why}")
            if skips and v in ("survived", "unexplained"):
                shown = "; ".join(f"`{s}`" for s in skips[:5])
                more = f" and {len(skips) - 5} more" if len(skips) > 5 else ""
                lines.append(f"  Skipped in its gate: {shown}{more}.")
    return [*lines, ""]


def render(summaries: Sequence[Mapping[str, Any]], bugs: Sequence[Bug]) -> str:
    """The page: one section a run (device and tiers), then the corpus with its provenance."""
    lines = [
        f"# Power on real bugs: {len(bugs)} fused-MoE bugs vLLM shipped and fixed, re-planted into 0.33.0",
        "",
        (
            "Each bug below was found in vLLM's pull requests, re-planted into a copy of vLLM 0.33.0's Python "
            "(`power/real-bugs.toml`: the edit, never the installed file) and run through `moegate gate` on its own "
            "build (`python -m moegate.power corpus run`, docs/design/power.md). **killed**: a behaviour test failed; "
            "**flagged**: only a review check of vLLM's source against a reviewed record failed; **survived**: the "
            f"gate passed. Issue 45 asks at least {TARGET:.0%} killed by behaviour on the GPU (dispatch and kernels)."
        ),
        "",
    ]
    for summary in summaries:
        lines += _section(summary, bugs)
    lines += ["## The corpus", ""]
    for bug in bugs:
        edits = "; ".join(
            f"`{Path(e.file).name}::{e.scope}`: `{e.find.strip()}` → `{e.replace.strip()}`" for e in bug.edits
        )
        lines += [
            f"### `{bug.id}`: [{bug.upstream}]({bug.url})",
            "",
            f"*{bug.title}*. {bug.what}",
            "",
            f"Re-plant: {edits}. Expected: {bug.expect}" + (f" (`{bug.expect_test}`)" if bug.expect_test else "") + ".",
            "",
        ]
    return "\n".join(lines)


def load_summary(folder: Path) -> dict[str, Any]:
    """A run's ``summary.json`` (``folder`` is the run's output folder, or the file itself)."""
    path = folder / "summary.json" if folder.is_dir() else folder
    return json.loads(path.read_text(encoding="utf-8"))
