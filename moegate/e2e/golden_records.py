"""The e2e tier's goldens: one JSONL record per prompt or question, keyed by what changes numerics.

A golden file is ``golden/e2e/<gate>/<key>.jsonl``. Its first line is the provenance
record (``{"provenance": {...}}``: vLLM, torch, device, driver, model and its hash,
flags, in-flight count, date) and is not compared; every other line is one record.
The key is built from what changes the numbers (vLLM release, device class, dtype,
model hash, the server flags, the in-flight count), so a golden is never compared
with a run it cannot equal. A key with no golden is reported with the bless command to run
(and fails only under ``--strict-goldens``); a golden changes only through that command (atomic write, the diff printed); a
truncated or invalid golden is an error naming the line. What a run's records are checked
against, and what that verdict is: ``moegate/e2e/rules/golden.py``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegate.core.golden_files import GOLDEN_DIR, atomic_write, obtained_path

E2E_GOLDEN_DIR = GOLDEN_DIR / "e2e"
BLESS = "nox -s bless -- e2e --base=... --pr=...   (the same options as the failing run)"


class GoldenError(ValueError):
    """A golden that cannot be read: names the file and the line."""


@dataclass(frozen=True)
class Key:
    """What a golden is keyed by. ``slug`` is its file name, readable and unique."""

    gate: str
    vllm: str
    device: str
    dtype: str
    model_hash: str
    flags: tuple[str, ...]
    size: str = ""
    """How much was run (prompts and tokens, questions): a smaller run has another golden."""
    in_flight: int | None = None

    @property
    def slug(self) -> str:
        flags = hashlib.sha256(" ".join(self.flags).encode()).hexdigest()[:8]
        parts = [f"vllm-{self.vllm}", self.device, self.dtype, f"model-{self.model_hash[:8]}", f"flags-{flags}"]
        if self.size:
            parts.append(self.size)
        if self.in_flight is not None:
            parts.append(f"c{self.in_flight}")
        return re.sub(r"[^A-Za-z0-9._-]+", "-", "--".join(parts))

    def path(self, directory: Path = E2E_GOLDEN_DIR) -> Path:
        return directory / self.gate / f"{self.slug}.jsonl"


def render(provenance: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> str:
    lines = [json.dumps({"provenance": dict(provenance)}, sort_keys=True)]
    lines += [json.dumps(dict(r), sort_keys=True) for r in records]
    return "\n".join(lines) + "\n"


def read(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Provenance and records of a golden; any malformed line is a ``GoldenError`` naming it."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GoldenError(f"golden {path}: {exc.strerror}") from None
    if not text.endswith("\n"):
        raise GoldenError(f"golden {path}: truncated (the last line has no newline)")
    lines = text.splitlines()
    records = []
    provenance: dict[str, Any] | None = None
    for no, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GoldenError(f"golden {path}, line {no}: not JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise GoldenError(f"golden {path}, line {no}: not a JSON object")
        if no == 1:
            if "provenance" not in obj:
                raise GoldenError(f"golden {path}, line 1: no provenance record")
            provenance = obj["provenance"]
        else:
            records.append(obj)
    if provenance is None:
        raise GoldenError(f"golden {path}: empty")
    return provenance, records


@dataclass
class GoldenOutcome:
    path: Path
    status: str  # "match", "missing", "differs", "blessed"
    message: str
    records: list[dict[str, Any]] | None = None


def check(
    key: Key,
    provenance: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    *,
    bless: bool = False,
    directory: Path = E2E_GOLDEN_DIR,
) -> GoldenOutcome:
    """Compare ``records`` with the golden of ``key``; with ``bless`` write them instead (diff printed)."""
    path = key.path(directory)
    text = render(provenance, records)
    body = text.split("\n", 1)[1]
    if bless:
        old = path.read_text(encoding="utf-8").split("\n", 1)[1] if path.exists() else ""
        if old == body:  # nothing moved: keep the golden, and the provenance of the run that made it
            obtained_path(path).unlink(missing_ok=True)
            return GoldenOutcome(path, "blessed", f"{path} unchanged ({len(records)} records)")
        atomic_write(path, text)
        obtained_path(path).unlink(missing_ok=True)
        diff = list(difflib.unified_diff(old.splitlines(), body.splitlines(), "old", "new", lineterm="", n=0))
        changed = sum(1 for d in diff if d.startswith("+") and not d.startswith("+++"))
        return GoldenOutcome(path, "blessed", f"blessed {path} ({len(records)} records, {changed} new or changed)")
    if not path.exists():
        atomic_write(obtained_path(path), text)
        return GoldenOutcome(
            path, "missing", f"no golden for this key: {path}; review {obtained_path(path)}, then bless: {BLESS}"
        )
    _, want = read(path)
    if want == [dict(r) for r in records]:
        obtained_path(path).unlink(missing_ok=True)
        return GoldenOutcome(path, "match", f"matches {path.name}", want)
    atomic_write(obtained_path(path), text)
    return GoldenOutcome(path, "differs", f"differs from {path}; obtained: {obtained_path(path)}", want)


def device_class(info: dict[str, Any]) -> str:
    """The device part of a golden's key: the GPU's name, or the CPU's widest vector ISA."""
    dev = str(info.get("device", "cpu"))
    if dev != "cpu":
        return dev
    flags = ""
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        pass
    for isa in ("amx_bf16", "avx512_bf16", "avx512f", "avx2"):
        if f" {isa}" in flags:
            return f"cpu-{isa}"
    return f"cpu-{platform.machine()}"


def flag_value(flags: Sequence[str], name: str, default: str) -> str:
    """The value of ``name`` in a server's flags: the last one given, which is the one the server uses (a build's
    own flags come after the common ones)."""
    value = default
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif f.startswith(name + "="):
            value = f.split("=", 1)[1]
    return value
