"""What an e2e gate hands back: one verdict, a one-line summary, a Markdown section, the differences.

Kept minimal on purpose: the greedy gate and the GSM8K gate both return it, the result
page concatenates ``details_markdown``, and ``differences`` (plain JSON-able dicts)
is what a run writes in full beside the page.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class GateResult:
    gate: str
    passed: bool
    summary: str
    details_markdown: str = ""
    differences: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write_json(self, path: str | Path) -> Path:
        """The whole result, differences untruncated, as one JSON file."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return out
