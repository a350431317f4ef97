"""The e2e result page: Markdown that fits a CI job summary, written atomically."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from moegate.core.golden_files import atomic_write
from moegate.e2e.verdict import GateResult

if TYPE_CHECKING:
    from moegate.e2e.run_data import BuildRun


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(
    title: str,
    runs: Sequence[BuildRun],
    results: Sequence[GateResult],
    *,
    commands: Sequence[str],
    error: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    passed = error is None and bool(results) and all(r.passed for r in results)
    verdict = "ERROR" if error else ("PASS" if passed else "FAIL")
    out = [f"# {title}: {verdict}", ""]
    if error:
        out += ["The run stopped before every gate could run; no golden was written.", "", "```", error, "```", ""]
    if runs:
        out += ["| build | vLLM | torch | device | flags | server start (s) | greedy (s) | GSM8K (s) |"]
        out += ["| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for run in runs:
            info, secs, start = run.info, run.seconds, run.start_s
            out.append(
                f"| {run.build.label} | {info.get('vllm')} | {info.get('torch')} | {_cell(info.get('device'))} "
                f"| `{_cell(' '.join(run.build.server_args)) or '-'}` | {_start(info, start)} "
                f"| {secs.get('greedy', 0):.0f} | {secs.get('gsm8k', 0):.0f} |"
            )
        out.append("")
    if results:
        out += ["| gate | verdict | summary |", "| --- | --- | --- |"]
        out += [f"| {_cell(r.gate)} | {r.verdict} | {_cell(r.summary)} |" for r in results]
        out.append("")
    for result in results:
        if not result.passed and result.details_markdown:
            out += [f"## {result.gate}", "", result.details_markdown, ""]
    if notes:
        out += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    out += ["## Reproduce", "", "```sh", *commands, "```", ""]
    return "\n".join(out)


def _start(info: dict, start: float | None) -> str:
    if info.get("attached"):
        return f"attached ({_cell(info['attached'])})"
    return f"{start:.0f}" if start else str(start)


def write(path: Path, text: str) -> None:
    atomic_write(path, text)


def environment_line() -> str:
    return f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores"
