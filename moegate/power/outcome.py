"""The outcome model: each mutant with its result, the run's outcome, its score and when it passes.

Plain data, no tool: the cosmic-ray driver fills it, the report renders it, and
the reviewed equivalent mutants (``power/equivalent-mutants.toml``) decide which
survivors do not fail the run.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moegate.power.errors import PowerError
from moegate.power.regions import GROUPS, Region

GROUP_NAMES = tuple(GROUPS)

BUILD_PYTHON = "{python}"  # in a test command: the test build's interpreter (overlay and frozen suite first)

# statuses that count towards the score; "equivalent", "no-mutation" and "pending" do not.
# "unreached": on a line the tests never execute (moegate.power.reach), a survivor known without a run.
SCORED = ("killed", "timeout", "survived", "unreached", "incompetent")


@dataclass
class Mutant:
    """One cosmic-ray work item inside a region, with its result."""

    id: str  # stable across releases: file:scope:operator@+line-offset:col[#k]
    job_id: str
    file: str
    line: int
    operator: str
    region: str
    status: str = (
        "pending"  # killed | survived | unreached | timeout | incompetent | equivalent | no-mutation | pending
    )
    first_failure_s: float | None = None
    failing_test: str | None = None
    via: str | None = None
    wall_s: float | None = None
    diff: str = ""
    reason: str = ""  # equivalent: why; incompetent/killed-by-error: first line of output


def mutant_id(region: Region, operator: str, line: int, col: int) -> str:
    """An id that survives code moving above the function: lines count from the enclosing ``def``."""
    short = operator.split("/", 1)[-1]
    return f"{Path(region.spec.file).stem}:{region.spec.scope}:{short}@+{line - region.anchor}:{col}"


def score(counts: Mapping[str, int]) -> float | None:
    """Killed (timeouts included) over scored mutants, from a status -> count map; None before any is scored."""
    scored = sum(counts.get(s, 0) for s in SCORED)
    return None if not scored else (counts.get("killed", 0) + counts.get("timeout", 0)) / scored


def load_equivalents(path: Path, groups: Sequence[str] | None = None) -> dict[str, str]:
    """Reviewed equivalent mutants: id -> reason. Every entry needs a non-empty reason.

    An entry names the region group it was reviewed in (``group = "kernel"``; default ``dispatch``);
    ``groups`` keeps only those groups' entries, so a run of one group never calls another group's
    entries stale. ``None``: every entry.
    """
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    out: dict[str, str] = {}
    for key, entry in data.get("mutant", {}).items():
        reason = entry.get("reason", "").strip() if isinstance(entry, dict) else ""
        if not reason:
            raise PowerError(f"{path}: equivalent mutant {key!r} has no reason; say why it cannot change behaviour")
        group = entry.get("group", "dispatch")
        if group not in GROUP_NAMES:
            raise PowerError(
                f"{path}: equivalent mutant {key!r}: group {group!r} is not one of {', '.join(GROUP_NAMES)}"
            )
        if groups is None or group in groups:
            out[key] = reason
    return out


def apply_equivalents(mutants: Sequence[Mutant], equivalents: Mapping[str, str]) -> list[str]:
    """Mark the run's survivors the review calls equivalent (and un-mark those it no longer does), as a run would;
    return the reviewed entries that match no mutant here (stale)."""
    for m in mutants:
        if m.status in ("survived", "equivalent"):
            m.status = "equivalent" if m.id in equivalents else "survived"
            m.reason = equivalents.get(m.id, "")
    ids = {m.id for m in mutants}
    return sorted(k for k in equivalents if k not in ids)


@dataclass
class Outcome:
    vllm_version: str
    package_dir: str
    command: str
    test_command: str
    regions: list[dict[str, Any]]
    mutants: list[Mutant]
    baseline: dict[str, Any]
    wall_s: float
    installed_hashes: dict[str, str]
    installed_unchanged: bool
    stale_equivalents: list[str] = field(default_factory=list)
    budget_s: float = 30.0
    suite_rev: str = "unknown"
    vllm_python: str = ""  # the interpreter the test runs' build was made from
    groups: list[str] = field(default_factory=lambda: ["dispatch"])  # the region groups mutated (regions.GROUPS)
    shards: list[str] = field(default_factory=list)  # "K/N" of each shard this outcome holds; [] for a whole run
    cut: str = ""  # why the run stopped before its last mutant (its unrun mutants are pending); "" when it did not

    def count(self, status: str) -> int:
        return sum(1 for m in self.mutants if m.status == status)

    @property
    def scored(self) -> int:
        return sum(1 for m in self.mutants if m.status in SCORED)

    @property
    def score(self) -> float | None:
        return score({s: self.count(s) for s in SCORED})

    @property
    def missing_shards(self) -> list[str]:
        """The shards of the split this outcome lacks ("K/N"); [] for a whole run or a complete set."""
        if not self.shards:
            return []
        n = int(self.shards[0].split("/")[1])
        have = {int(s.split("/")[0]) for s in self.shards}
        return [f"{k}/{n}" for k in range(n) if k not in have]

    @property
    def passed(self) -> bool:
        return (
            not self.missing_shards
            and self.count("survived") == 0
            and self.count("unreached") == 0
            and self.count("incompetent") == 0
            and self.count("pending") == 0
            and self.installed_unchanged
        )
