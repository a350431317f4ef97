"""A preflight check's one line, and the report of them all (``moegate preflight --json``'s contract)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

GIB = 1 << 30


class PreflightError(Exception):
    """Bad input to preflight itself, or a GPU it cannot see (not a failed check): one line, exit 2."""


@dataclasses.dataclass
class Check:
    name: str
    status: str  # "ok", "FAIL" or "info"
    text: str

    def line(self) -> str:
        return f"{self.status:<4} {self.name}: {self.text}"


@dataclasses.dataclass
class Report:
    checks: list[Check] = dataclasses.field(default_factory=list)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.status != "FAIL" for c in self.checks)

    def add(self, name: str, status: str, text: str, out: Callable[[str], None] = print) -> None:
        check = Check(name, status, text)
        self.checks.append(check)
        out(check.line())

    def to_json(self) -> dict[str, Any]:
        keys = ("gpu", "gpu_memory_gib", "pcie_gen", "pcie_width", "uva_read_gbps", "pinnable_gib", "free_disk_gib")
        body: dict[str, Any] = {k: self.facts.get(k) for k in keys}
        body.update({k: v for k, v in self.facts.items() if k not in body})
        body["ok"] = self.ok
        body["checks"] = [dataclasses.asdict(c) for c in self.checks]
        return body
