"""Each failing leg of a gate run, by name, with its page: what the reusable workflow's verdict job says.

    python -m tooling.ci.leg_pages mark --leg LEG --outcome OUTCOME [--reports reports]
    python -m tooling.ci.leg_pages verdict --dir LEGS --attempt N --run-url URL --plan RESULT --dispatch true|false
        --meta true|false --gpu-matrix JSON

``mark`` is every tier job's last step before its upload (``if: always()``): ``reports/leg.json`` with the leg's
name, the job's outcome and its page (``reports/gate.md``, which ``moegate gate`` writes, else the first
``reports/*.md``). The job uploads ``reports/`` as ``moegate-<leg>-attempt<N>``.

``verdict`` reads those artifacts (downloaded into ``LEGS/<artifact>/``) against the legs the plan asked for
(dispatch, meta, each GPU leg of the matrix) and writes, to stdout as ``::error::`` lines and to
``$GITHUB_STEP_SUMMARY`` as Markdown, each leg that did not succeed: its name, its outcome, the artifact that
holds its page with a link to the run, and the page itself. A planned leg with no artifact is named as such: its job
never reached its upload (a lost runner, a cancelled run, a fork's leg skipped). It only reports; the step after it
decides the job's exit. Standard library only, exit 0 (2: bad input, one line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

MARK = "leg.json"
PAGE_MAX = 20_000  # characters of a page the summary shows (a step summary holds at most 1 MiB)


@dataclass(frozen=True)
class Leg:
    name: str
    job: str
    """The job as the run lists it (``dispatch tier``, ``gpu kernels-pr``)."""
    outcome: str
    artifact: str
    page: str | None = None
    page_text: str = ""


def mark(leg: str, outcome: str, reports: Path) -> Path:
    reports.mkdir(parents=True, exist_ok=True)
    pages = sorted(p.name for p in reports.glob("*.md"))
    page = "gate.md" if "gate.md" in pages else (pages[0] if pages else None)
    out = reports / MARK
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"leg": leg, "outcome": outcome, "page": page}) + "\n")
    tmp.replace(out)
    return out


def planned(dispatch: bool, meta: bool, matrix: str) -> list[tuple[str, str]]:
    """(leg, job name) of every leg the plan asked for."""
    legs = [("dispatch", "dispatch tier")] if dispatch else []
    legs += [("meta", "meta-check")] if meta else []
    try:
        include = json.loads(matrix or '{"include": []}').get("include", [])
    except (json.JSONDecodeError, AttributeError):
        raise ValueError(f"--gpu-matrix is not the plan's JSON: {matrix[:80]!r}") from None
    return legs + [(str(leg["leg"]), f"gpu {leg['leg']}") for leg in include]


def collect(directory: Path, attempt: str, want: list[tuple[str, str]]) -> list[Leg]:
    found = []
    for name, job in want:
        artifact = f"moegate-{name}-attempt{attempt}"
        reports = directory / artifact / "reports"
        try:
            rec = json.loads((reports / MARK).read_text())
        except (OSError, json.JSONDecodeError):
            found.append(Leg(name, job, "no report (its job never reached its upload)", artifact))
            continue
        page = rec.get("page")
        text = (reports / page).read_text(errors="replace") if page and (reports / page).is_file() else ""
        found.append(Leg(name, job, str(rec.get("outcome")), artifact, page, text))
    return found


def summary(legs: list[Leg], run_url: str) -> str:
    bad = [leg for leg in legs if leg.outcome != "success"]
    if not bad:
        return f"### Every leg succeeded ({', '.join(leg.name for leg in legs) or 'none planned'})\n"
    lines = [f"### Failing legs: {', '.join(leg.name for leg in bad)}", ""]
    for leg in bad:
        where = (
            f"`reports/{leg.page}` in artifact `{leg.artifact}`" if leg.page else f"no page (artifact `{leg.artifact}`)"
        )
        lines.append(f"- **{leg.job}**: {leg.outcome}; page: {where}, [the run's artifacts]({run_url}#artifacts)")
    for leg in bad:
        if leg.page_text:
            text = leg.page_text if len(leg.page_text) <= PAGE_MAX else leg.page_text[:PAGE_MAX] + "\n\n(cut here)"
            lines += ["", f"<details><summary>{leg.job}: reports/{leg.page}</summary>", "", text, "", "</details>"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.ci.leg_pages", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mark")
    m.add_argument("--leg", required=True)
    m.add_argument("--outcome", required=True)
    m.add_argument("--reports", type=Path, default=Path("reports"))
    v = sub.add_parser("verdict")
    v.add_argument("--dir", type=Path, required=True)
    v.add_argument("--attempt", default="1")
    v.add_argument("--run-url", default="")
    v.add_argument("--dispatch", default="false")
    v.add_argument("--meta", default="false")
    v.add_argument("--gpu-matrix", default="")
    v.add_argument("--plan", default="success", help="the plan job's result")
    args = ap.parse_args(argv)
    if args.cmd == "mark":
        print(f"leg {args.leg}: {args.outcome} ({mark(args.leg, args.outcome, args.reports)})")
        return 0
    if args.plan != "success":
        text = f"### The plan did not succeed ({args.plan}): no leg ran; its one line is in the plan job's log\n"
        print(f"::error::plan: {args.plan}: no leg ran")
        _write(text)
        return 0
    try:
        want = planned(args.dispatch == "true", args.meta == "true", args.gpu_matrix)
    except ValueError as exc:
        print(f"moegate: {exc}", file=sys.stderr)
        return 2
    legs = collect(args.dir, args.attempt, want)
    for leg in legs:
        if leg.outcome != "success":
            page = f"reports/{leg.page} in {leg.artifact}" if leg.page else f"no page ({leg.artifact})"
            print(f"::error::{leg.job}: {leg.outcome}; page: {page}")
    _write(summary(legs, args.run_url))
    return 0


def _write(text: str) -> None:
    print(text, end="")
    if os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as fh:
            fh.write(text)


if __name__ == "__main__":
    raise SystemExit(main())
