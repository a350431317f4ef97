"""Read a corpus run's results again from the evidence its gates left: each bug's JUnit report and gate log.

A run's ``summary.json`` is what the runner read from that evidence at the time. Where the reading was wrong (the
2026-12-06 H100 run took the gate's last line, the page's path, for its verdict line, so a diff-tier FAIL read as
"gate exit 1 without a failing test"), the evidence still holds the answer: this reads every gate that ran again with
today's readers (``corpus_run.read_junit`` and ``corpus_run.verdict_line``), rewrites each ``result.json``, the
summary and its page, and says on the page that it did. Nothing is run; a gate's exit status, wall time and planted
files are kept as they were recorded.

    python -m moegate power corpus rescan RUN_DIR [--project-rev REV]
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from moegate.core.golden_files import atomic_write
from moegate.paths import ROOT
from moegate.power.corpus import Bug, load
from moegate.power.corpus_report import load_summary, render
from moegate.power.corpus_run import read_junit, verdict_line


def corpus_of(summary: dict[str, Any]) -> tuple[Bug, ...]:
    """The bugs of the corpus file a run was made from (its ``corpus``, relative to the checkout)."""
    corpus = Path(summary["corpus"])
    return load(corpus if corpus.is_absolute() else ROOT / corpus)


def rescan(out: Path, project_rev: str | None = None) -> dict[str, Any]:
    """The run in ``out`` read again from its gates' logs and JUnit reports; writes it back and returns the summary."""
    summary = load_summary(out)
    for result in summary["results"]:
        folder = out / result["id"]
        if result["status"] != "ran" or not folder.is_dir():
            continue
        try:
            tests, failures, skips = read_junit(folder / "gate.xml")
        except (OSError, ET.ParseError):
            pass  # no report: what was recorded stands
        else:
            result.update(tests=tests, failures=[asdict(f) for f in failures], skips=skips)
        if result.get("exit_code") not in (0, 2):
            result["error"] = verdict_line(folder / "gate.log")
        atomic_write(folder / "result.json", json.dumps(result, indent=1) + "\n")
    if project_rev:
        summary["project_rev"] = project_rev
    summary["rescanned"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    bugs = corpus_of(summary)
    atomic_write(out / "summary.json", json.dumps(summary, indent=1) + "\n")
    atomic_write(out / "summary.md", render([summary], bugs))
    return summary
