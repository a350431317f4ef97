"""The reviewed reasons why something the report lists is not exercised: ``reach/reasons.toml``.

Each ``[[reason]]`` entry says what it covers and why, in one of three kinds (``KINDS``):

- ``hardware``: hardware this gate does not run on (ROCm, XPU, TPU, CPU-only kernels, Blackwell-only
  kernels...): ``why`` names it;
- ``scope``: a feature outside the gate's scope, which ``why`` names (another MoE backend than the
  Triton fused MoE the spec is about, all-to-all expert parallelism across processes, LoRA...);
- ``census``: reached by no configuration the census lists. ``absent`` states the census fact as a
  record pattern (``{kind = "tuned", dtype = "int8_w8a8", lookup = true}``: dotted keys reach into a
  record's groups), and the claim is checked: a census record that matches it makes the reason wrong
  (``contradicted``).

What an entry covers: ``where``, a list of ``FILE_GLOB`` or ``FILE_GLOB::QUALNAME_GLOB`` (files relative
to the ``vllm`` folder) for branches, narrowed by ``line`` (the branch leaves a source line containing
that text: a platform check, a flag) when given; or ``items``, labels of required specialisations and
conditions (``condition:K tail``). The first entry that covers a thing gives its reason.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegate.paths import ROOT
from moegate.reach.layout import matches

REASONS = ROOT / "reach" / "reasons.toml"
KINDS = {
    "hardware": "hardware this gate does not run on",
    "scope": "a feature outside the gate's scope",
    "census": "reached by no configuration the census lists",
}


class ReasonsError(ValueError):
    """A reasons file that cannot be read as this module says; the message is one line."""


@dataclass(frozen=True)
class Reason:
    index: int  # position in the file, 1-based: the report cites ``reasons.toml #N``
    kind: str
    why: str
    where: tuple[str, ...] = ()
    line: tuple[str, ...] = ()  # any of these texts; empty: every line
    items: tuple[str, ...] = ()
    absent: tuple[tuple[str, Any], ...] = ()

    @property
    def cite(self) -> str:
        return f"{self.kind} (#{self.index}): {self.why}"

    def covers_branch(self, rel: str, qualname: str, text: str) -> bool:
        if not any(matches(p, rel, qualname) for p in self.where):
            return False
        return not self.line or any(t in text for t in self.line)

    def covers_item(self, label: str) -> bool:
        return label in self.items


def _field(rec: Mapping[str, Any], dotted: str) -> Any:
    value: Any = rec
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


_MISSING = object()


def contradicted(reason: Reason, records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The census records a ``census`` reason's ``absent`` pattern matches (empty: the claim holds)."""
    if reason.kind != "census":
        return []
    return [r for r in records if all(_field(r, k) == v for k, v in reason.absent)]


def parse(text: str, source: str = "reasons.toml") -> list[Reason]:
    """The entries of a reasons file (see the module docstring); ``ReasonsError`` names the first bad one."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ReasonsError(f"{source}: not TOML ({exc})") from exc
    out = []
    for i, entry in enumerate(data.get("reason", []), 1):
        where = f"{source} #{i}"
        unknown = set(entry) - {"kind", "why", "where", "line", "items", "absent"}
        if unknown:
            raise ReasonsError(f"{where}: unknown field(s) {sorted(unknown)}")
        kind, why = entry.get("kind"), str(entry.get("why", "")).strip()
        if kind not in KINDS:
            raise ReasonsError(f"{where}: kind {kind!r} is none of {', '.join(KINDS)}")
        if not why:
            raise ReasonsError(f"{where}: a reason needs its why (which hardware, which feature, which census fact)")
        if not entry.get("where") and not entry.get("items"):
            raise ReasonsError(f"{where}: covers nothing (give where = [...] or items = [...])")
        line = entry.get("line", ())
        line = (line,) if isinstance(line, str) else line
        if not isinstance(line, list | tuple) or not all(isinstance(t, str) and t for t in line):
            raise ReasonsError(f"{where}: line is a text or a list of texts the branch's source line contains")
        absent = entry.get("absent", {})
        if kind == "census" and not absent:
            raise ReasonsError(f"{where}: a census reason states the census fact it rests on: absent = {{...}}")
        out.append(
            Reason(
                i,
                kind,
                " ".join(why.split()),
                tuple(entry.get("where", ())),
                tuple(line),
                tuple(entry.get("items", ())),
                tuple(sorted(absent.items())),
            )
        )
    return out


def load(path: Path = REASONS) -> list[Reason]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ReasonsError(f"cannot read {path} ({exc.strerror})") from exc
    return parse(text, path.name)


def first(
    reasons: Sequence[Reason], *, branch: tuple[str, str, str] | None = None, item: str | None = None
) -> Reason | None:
    """The first reason covering a branch ``(file, qualname, source line)`` or an item label."""
    for reason in reasons:
        if branch is not None and reason.covers_branch(*branch):
            return reason
        if item is not None and reason.covers_item(item):
            return reason
    return None
