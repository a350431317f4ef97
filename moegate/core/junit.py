"""What a JUnit report says ran: the kernel tier's floor of *executed* tests (``moegate gate --min-kernel-tests``),
and which tests failed, with their reports' text (``moegate gate``'s page and its runner-fault verdict).

A kernel tier that skipped everything (no CUDA, no UVA, a broken driver) exits 0 from pytest; the floor makes it red
instead. Executed = tests - skipped - errors (a failed test did execute; pytest's own status fails the run for it).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Counts:
    tests: int
    skipped: int
    errors: int
    failures: int
    first_skip: str = ""
    """The reason of the first skipped test (what a floor's failure quotes)."""

    @property
    def executed(self) -> int:
        return self.tests - self.skipped - self.errors

    def detail(self) -> str:
        return f"{self.tests} collected, {self.skipped} skipped, {self.errors} errors, {self.failures} failed"


def count(path: Path, prefix: str = "") -> Counts:
    """Count the testcases whose classname starts with ``prefix`` (all of them when empty).

    ``OSError`` or ``xml.etree.ElementTree.ParseError`` when the report is missing or unreadable."""
    root = ET.parse(path).getroot()
    tests = skipped = errors = failures = 0
    first_skip = ""
    for case in root.iter("testcase"):
        if not case.get("classname", "").startswith(prefix):
            continue
        tests += 1
        skip = case.find("skipped")
        if skip is not None:
            skipped += 1
            first_skip = first_skip or (skip.get("message") or "").strip()
        elif case.find("error") is not None:
            errors += 1
        elif case.find("failure") is not None:
            failures += 1
    return Counts(tests, skipped, errors, failures, first_skip)


@dataclass(frozen=True)
class Failed:
    """A testcase that failed or errored: its id as pytest prints it, and the failure's message and text."""

    nodeid: str
    message: str
    text: str


def failed(path: Path) -> list[Failed]:
    """Every failing or erroring testcase, in the report's order; ``OSError`` or ``ParseError`` as ``count``."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is None:
            continue
        out.append(Failed(nodeid(case), (bad.get("message") or "").strip(), (bad.text or "").strip()))
    return out


def nodeid(case: ET.Element) -> str:
    """A JUnit testcase's id as pytest prints it (``tests/kernels/test_kernel_census.py::TestZ::test_w[p]``), from its classname."""
    parts = case.get("classname", "").split(".")
    cls = [parts.pop()] if len(parts) > 1 and parts[-1].startswith("Test") else []  # pytest's Test* classes
    return "::".join([f"{'/'.join(parts)}.py", *cls, case.get("name", "")] if parts[0] else [case.get("name", "")])
