"""Fail unless a JUnit report shows at least N *executed* tests: the GPU job's floor.

A kernel tier that skipped everything (no CUDA, no UVA, a broken driver) exits 0
from pytest; this makes it red instead. Executed = tests - skipped - errors (a
failed test did execute; pytest's own exit code already fails the job for it).

    python -m tooling.ci.junit_min reports/gate.xml --min 40 --prefix tests.kernels

prints one line and exits 0 when the floor is met, 1 when it is not, 2 when the
report is missing or unreadable.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Counts:
    tests: int
    skipped: int
    errors: int
    failures: int

    @property
    def executed(self) -> int:
        return self.tests - self.skipped - self.errors


def count(path: Path, prefix: str = "") -> Counts:
    """Count the testcases whose classname starts with ``prefix`` (all of them when empty)."""
    root = ET.parse(path).getroot()
    tests = skipped = errors = failures = 0
    for case in root.iter("testcase"):
        if not case.get("classname", "").startswith(prefix):
            continue
        tests += 1
        if case.find("skipped") is not None:
            skipped += 1
        elif case.find("error") is not None:
            errors += 1
        elif case.find("failure") is not None:
            failures += 1
    return Counts(tests, skipped, errors, failures)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.ci.junit_min", description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--min", type=int, required=True, dest="minimum")
    ap.add_argument("--prefix", default="", help="only testcases whose classname starts with this (e.g. tests.kernels)")
    args = ap.parse_args(argv)
    what = f"tests under {args.prefix}" if args.prefix else "tests"
    try:
        c = count(args.report, args.prefix)
    except (OSError, ET.ParseError) as exc:
        print(f"junit-min: cannot read {args.report}: {exc}", file=sys.stderr)
        return 2
    detail = f"{c.tests} collected, {c.skipped} skipped, {c.errors} errors, {c.failures} failed"
    if c.executed < args.minimum:
        print(
            f"junit-min: only {c.executed} {what} executed ({detail}); at least {args.minimum} required",
            file=sys.stderr,
        )
        return 1
    print(f"junit-min: {c.executed} {what} executed ({detail}); minimum {args.minimum} met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
