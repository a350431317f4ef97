"""The power report: a Markdown page (fit for ``$GITHUB_STEP_SUMMARY``) and its JSON twin."""

from __future__ import annotations

import dataclasses
from typing import Any

from moegate.power.driver import TOOL
from moegate.power.outcome import BUILD_PYTHON, Outcome


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _build_note(o: Outcome) -> str:
    if BUILD_PYTHON not in o.test_command:
        return ""
    made_from = f" made from `{o.vllm_python}`" if o.vllm_python else ""
    return f"; `{BUILD_PYTHON}`: a venv{made_from} with the overlay and the frozen suite first on its path"


def _shards_row(o: Outcome) -> str:
    missing = f"; MISSING {', '.join(o.missing_shards)}" if o.missing_shards else ""
    return f"| shards | {', '.join(o.shards)}{missing} |"


def render_markdown(o: Outcome) -> str:
    """The report page; plain GitHub Markdown, fit for $GITHUB_STEP_SUMMARY."""
    score = "n/a" if o.score is None else f"{100 * o.score:.1f} %"
    killed = [m for m in o.mutants if m.status in ("killed", "timeout")]
    times = [m.first_failure_s for m in killed if m.first_failure_s is not None]
    over = [m for m in killed if m.first_failure_s is None or m.first_failure_s > o.budget_s]
    verdict = "PASS" if o.passed else "FAIL"
    lines = [
        f"# Gate power: vLLM {o.vllm_version} fused-MoE {', '.join(o.groups)}, mutation testing",
        "",
        (
            f"**{verdict}: mutation score {score}**: {o.count('killed')} killed, {o.count('timeout')} timed out, "
            f"{o.count('survived')} survived, "
            + (f"{o.count('unreached')} unreached, " if o.count("unreached") else "")
            + f"{o.count('incompetent')} incompetent of {o.scored} scored mutants; "
            f"{o.count('equivalent')} equivalent (reviewed), {o.count('no-mutation')} no-op."
            + (f" **{o.count('pending')} not run**: {o.cut}." if o.count("pending") else "")
        ),
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| mutants in scope | {len(o.mutants)} |",
        *([_shards_row(o)] if o.shards else []),
        "| time to first failing example (s, vLLM import excluded) | "
        + (f"median {sorted(times)[len(times) // 2]:.2f}, max {max(times):.2f}" if times else "-")
        + " |",
        f"| killed within {o.budget_s:.0f} s | {len(killed) - len(over)} of {len(killed)} |",
        f"| tests on unmutated vLLM (s) | wall {o.baseline.get('wall_s')}, import {o.baseline.get('import_s')}, pytest total {o.baseline.get('total_s')} |",
        f"| total wall time (s) | {o.wall_s} |",
        f"| installed vLLM files unchanged (sha256 before = after) | {'yes' if o.installed_unchanged else 'NO'} |",
        f"| suite (moegate revision, frozen for the run) | {o.suite_rev} |",
        f"| tool | {TOOL} (local distributor), mutants run against a throw-away overlay |",
        "",
        f"Command: `{o.command or 'python -m moegate.power'}`  ",
        f"Test command per mutant: `{o.test_command}` (MOEGATE_PROFILE=power{_build_note(o)})",
        "",
        "## Regions mutated",
        "",
        "| region | file | lines | why |",
        "| --- | --- | --- | --- |",
        *[f"| `{r['region']}` | `{r['file']}` | {r['lines']} | {r['why']} |" for r in o.regions],
        "",
        "## Survivors",
        "",
    ]
    survivors = [m for m in o.mutants if m.status in ("survived", "incompetent")]
    if not survivors:
        lines.append("None.")
    for m in survivors:
        lines += [
            f"### `{m.id}` ({m.status})",
            "",
            f"line {m.line}, `{m.region}`" + (f": {m.reason}" if m.reason else ""),
            "",
            "```diff",
            m.diff.strip(),
            "```",
            "",
        ]
    unreached = [m for m in o.mutants if m.status == "unreached"]
    if unreached:
        lines += [
            "",
            "## Unreached by these tests",
            "",
            (
                "Survivors known without a run: a traced run of the unmutated tests never executes their statement "
                "(`moegate.power.reach`), so no test of this tier can tell them apart."
            ),
            "",
            "| region | mutants | lines |",
            "| --- | --- | --- |",
        ]
        by_region: dict[str, list[int]] = {}
        for m in unreached:
            by_region.setdefault(m.region, []).append(m.line)
        lines += [
            f"| `{region}` | {len(ls)} | {', '.join(str(n) for n in sorted(set(ls)))} |"
            for region, ls in by_region.items()
        ]
    lines += ["", "## Equivalent mutants (reviewed in power/equivalent-mutants.toml)", ""]
    eq = [m for m in o.mutants if m.status == "equivalent"]
    lines += [f"- `{m.id}`: {m.reason}" for m in eq] or ["None."]
    if o.stale_equivalents:
        lines += [
            "",
            "Entries in power/equivalent-mutants.toml that match no mutant of this release: "
            + ", ".join(f"`{k}`" for k in o.stale_equivalents),
        ]
    lines += [
        "",
        "## Killed mutants",
        "",
        "| mutant | line | first failure (s) | pytest total (s) | first failing test |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in killed:
        test = (m.failing_test or m.reason or "timeout").replace("|", "\\|")
        lines.append(
            f"| `{m.id}` | {m.line} | {_fmt_s(m.first_failure_s) if m.status == 'killed' else 'timeout'} | {_fmt_s(m.wall_s)} | {test} |"
        )
    return "\n".join(lines) + "\n"


def to_json(o: Outcome) -> dict[str, Any]:
    d = dataclasses.asdict(o)
    d["score"] = o.score
    d["passed"] = o.passed
    return d
