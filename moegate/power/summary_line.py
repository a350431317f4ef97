"""The one line each mutant's test run prints and the harness reads back: ``MOEGATE-POWER {json}``.

The pytest plugin (``moegate.power.plugin``) writes it at the end of the
dispatch tier's run; cosmic-ray keeps each run's output, and the harness finds
the line there. Both sides take the format from here, so they cannot drift apart.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from moegate.dispatch import names

MARK = "MOEGATE-POWER"

WATCHED = {
    "fused_moe_file": names.FUSED_MOE,
    "triton_moe_file": names.TRITON_MOE,
    "uva_offloader_file": names.UVA_OFFLOADER_MODULE,
    "loader_utils_file": names.LOADER_UTILS,
}
"""The line's keys for where each mutable module was loaded from, and the modules (None: not imported)."""


def render(summary: Mapping[str, Any]) -> str:
    return f"{MARK} {json.dumps(dict(summary), sort_keys=True)}"


def read(output: str | None) -> dict[str, Any] | None:
    """The plugin's summary from a test run's output, if it printed one (the last such line)."""
    for line in reversed((output or "").splitlines()):
        if line.startswith(MARK + " "):
            with contextlib.suppress(ValueError):
                return json.loads(line[len(MARK) + 1 :])
    return None
