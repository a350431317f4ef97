"""The census: everything ``moegate.census`` reads from one installed vLLM, as sorted JSON lines.

``take`` reads the source (a ``CensusError`` names what was missing and where;
nothing is returned half-made) and ``render`` writes the golden's text: a ``#``
provenance header (vLLM release, transformers release, census code version) and one
JSON object a line, sorted, keys sorted. Kinds, in order: ``builder``, ``layer``,
``activation``, ``quant-method``, ``tuned``, ``shape``, ``site``; see each module.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegate.census import builders, catalog, layers, sites, syntax, tuned
from moegate.census.archs import Architectures
from moegate.census.configs import ConfigIndex
from moegate.census.source import CensusError, VllmSource
from moegate.core import golden_files

CENSUS_VERSION = 1
"""Bumped when the census's reading or format changes (the goldens record it)."""

KINDS = ("builder", "layer", "activation", "quant-method", "tuned", "shape", "site")
GOLDEN_DIR = "census"
BLESS = "python -m moegate.census --bless"


def golden_name(version: str) -> str:
    """The golden of a vLLM release, relative to ``golden/``."""
    return f"{GOLDEN_DIR}/vllm-{version}.jsonl"


@dataclass(frozen=True)
class Census:
    vllm: str
    transformers: str | None
    records: tuple[dict[str, Any], ...]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]


def _key(rec: dict[str, Any]) -> tuple[int, str]:
    return KINDS.index(rec["kind"]), json.dumps(rec, sort_keys=True)


Preflight = tuple[
    list[Path],
    list[builders.Builder],
    tuple[list[dict[str, Any]], list[str]],
    set[str],
    list[dict[str, Any]],
    dict[str, list[str]],
]


def preflight(src: VllmSource) -> Preflight:
    """What a release must have before its model files are read, cheapest first; a ``CensusError`` names the gap.

    The source files, the layer builder, the tuned configs and the dtype names vLLM looks
    them up by, the activation enum, the decision's and the aligners' definitions.
    """
    syntax.read.cache_clear()  # a fresh read of every file: the tree may have changed since the last census
    syntax.parse.cache_clear()
    files = sorted(p for p in src.root.rglob("*.py") if "__pycache__" not in p.parts)
    if not files:
        raise CensusError(f"census: no Python source under {src.root}")
    found = builders.find_builders(src, files)
    tuned_files = tuned.tuned_files(src)
    dtypes = tuned.looked_up_dtypes(src)
    return files, found, tuned_files, dtypes, catalog.activations(src), sites.callee_params(src)


def take(src: VllmSource) -> Census:
    """Read one installed vLLM (see the package docstring).

    What a release must have is looked for first (``preflight``), so a tree the census
    cannot read fails in about a second, before the model files are parsed.
    """
    pre = preflight(src)
    files, found, (tuned_records, unparsed), dtypes, activation_records, site_params = pre
    grouped = tuned.grouped(tuned_records, dtypes)
    index = ConfigIndex(src)
    layer_records = layers.find_layers(src, found, files, index, Architectures(src))
    if not layer_records:
        raise CensusError(
            f"census: no model class under {src.root} calls a fused-MoE layer builder "
            f"({', '.join(b.name for b in found)}): looked for calls of it in every .py file"
        )
    records: list[dict[str, Any]] = [b.record() for b in found]
    records += layer_records
    records += activation_records
    records += catalog.quant_methods(src, files)
    records += grouped
    records += [{"kind": "tuned", "unparsed": name} for name in unparsed]
    records += tuned.shapes(layer_records, grouped)
    records += sites.find_sites(src, files, site_params)
    return Census(src.version, index.transformers_version, tuple(sorted(records, key=_key)))


def take_sites(src: VllmSource) -> list[dict[str, Any]]:
    """The dispatch sites alone (a second where the whole census takes several): ``kind == "site"`` records."""
    syntax.read.cache_clear()
    syntax.parse.cache_clear()
    files = sorted(p for p in src.root.rglob("*.py") if "__pycache__" not in p.parts)
    return sites.find_sites(src, files, sites.callee_params(src))


def render(census: Census) -> str:
    header = golden_files.provenance_header(
        {
            "what": "census of vLLM's fused-MoE configurations and dispatch sites (docs/design/census.md)",
            "vllm": census.vllm,
            "transformers": census.transformers or "absent",
            "census code": str(CENSUS_VERSION),
            "produced by": BLESS,
        }
    )
    return header + "".join(json.dumps(r, sort_keys=True) + "\n" for r in census.records)


def stamp(text: str, field: str) -> str | None:
    """A header field of a census golden (``vllm``, ``transformers``, ``census code``)."""
    prefix = f"# {field}: "
    return next((line[len(prefix) :].strip() for line in text.splitlines() if line.startswith(prefix)), None)


TRANSFORMERS_DERIVED = ("values", "config_classes")
"""Layer fields read from config classes (transformers' among them); ``shape`` lines are derived from them."""


def without_transformers(records: Iterable[dict[str, Any]]) -> list[str]:
    """The census lines that owe nothing to the transformers release beside vLLM, as sorted JSON text."""
    out = []
    for rec in records:
        if rec["kind"] == "shape":
            continue
        out.append(json.dumps({k: v for k, v in rec.items() if k not in TRANSFORMERS_DERIVED}, sort_keys=True))
    return sorted(out)


def parse_golden(text: str) -> list[dict[str, Any]]:
    """The records of a census golden's body."""
    return [json.loads(line) for line in golden_files.body(text).splitlines() if line.strip()]


def golden_path(version: str, directory: Path | None = None) -> Path:
    return (directory or golden_files.GOLDEN_DIR) / golden_name(version)


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def committed(directory: Path | None = None) -> dict[str, Path]:
    """The committed census goldens by vLLM version, oldest first."""
    folder = (directory or golden_files.GOLDEN_DIR) / GOLDEN_DIR
    found = {p.name[len("vllm-") : -len(".jsonl")]: p for p in folder.glob("vllm-*.jsonl")}
    return dict(sorted(found.items(), key=lambda kv: _release(kv[0])))


def reference_golden(version: str, directory: Path | None = None) -> tuple[str, Path] | None:
    """The golden to hold the installed release to: its own, else the newest committed (the release under review)."""
    goldens = committed(directory)
    if version in goldens:
        return version, goldens[version]
    if not goldens:
        return None
    newest = next(reversed(goldens))
    return newest, goldens[newest]


def site_key(rec: dict[str, Any]) -> str:
    return f"{rec['file']}::{rec['scope']}"
