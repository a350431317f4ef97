"""The replay's results page: results/ci-replay.md from results/ci-replay.json."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tooling.ci_replay.common import ANSI, step_name

# --- results ------------------------------------------------------------------------------------


def render(data: dict[str, Any]) -> str:
    rows = []
    for job in data["order"]:
        rec = data["jobs"].get(job)
        if rec is None:
            rows.append(f"| `{job}` | | not replayed yet | | | |")
            continue
        wall = f"{rec['wall_s'] // 60} min {rec['wall_s'] % 60:02d} s" if isinstance(rec.get("wall_s"), int) else ""
        note = f"failed step: `{step_name(rec['failed_step'])}`" if rec.get("failed_step") else ""
        rows.append(
            f"| `{job}` | {rec['event']} | **{rec['outcome']}** | {wall} | {rec['revision']} ({rec['date']}) | {note} |"
        )
    failures = []
    for job in data["order"]:
        rec = data["jobs"].get(job) or {}
        if rec.get("tail"):
            tail = [ANSI.sub("", line) for line in rec["tail"]]
            failures += [f"### `{job}`: `{step_name(rec.get('failed_step'))}`", "", "```", *tail, "```", ""]
    stand_ins = [f"- {k}: {v}" for k, v in data.get("stand_ins", {}).items()] or ["- (not recorded)"]
    return "\n".join(
        [
            "# CI replay: the hosted jobs of gate.yml and moegate.yml through act, on this machine",
            "",
            f"act {data.get('act', '?')} in host mode, under `env -i` (fresh HOME, `PIP_CONFIG_FILE=/dev/null`, no `../shared`), "
            "jobs one at a time; every stand-in and why it is needed: "
            "[tooling/ci_replay/README.md](../tooling/ci_replay/README.md). Machine: "
            + data.get("machine", machine())
            + ".",
            "",
            "| job | event | outcome | wall time | replayed at | note |",
            "| --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            "Commands (latest first):",
            "",
            *[f"- `{c}`" for c in reversed(data["commands"][-6:])],
            "",
            "This replay's stand-ins:",
            "",
            *stand_ins,
            "",
            *(["## Last lines of each failed job", "", *failures] if failures else []),
        ]
    )


def machine() -> str:
    model = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    return f"{os.cpu_count()} cores ({model}), shared with other work"
