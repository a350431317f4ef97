"""The rows of results/kernels-systematic.md's measured planted-error tables, from sweep JSONs or tier JUnit XMLs.

    python -m lab.gpu.systematic_table planted-sweep-0.0005.json planted-sweep-0.001.json ...   # checkout root

Per run and dtype family: for each entrypoint (legacy, modular), the groups the aggregate check detected
out of those it tested, and the range of the groups' estimates (relative bias). Then, per family and
entrypoint, the smallest planted eps (read from the file name, ``...-EPS.json``/``.xml``) at which the check
detected at least one group, and the smallest at which it detected every group it tested.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from typing import Any

FAMILIES = ("bfloat16", "float16", "float32", "wNa16-bfloat16", "wNa16-float16")
ENTRYPOINTS = ("legacy", "modular")


def load(path: str) -> dict[str, Any]:
    if path.endswith(".xml"):
        for p in ET.parse(path).iter("property"):
            if p.get("name") == "systematic":
                return json.loads(p.get("value") or "{}")
        raise SystemExit(f"{path}: no 'systematic' property in the JUnit XML")
    return json.load(open(path))["systematic"]


def eps_of(path: str) -> float | None:
    m = re.search(r"-([0-9.]+)\.(json|xml)$", path)
    return float(m.group(1)) if m else None


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: python -m lab.gpu.systematic_table RUN.json|RUN.xml...", file=sys.stderr)
        return 2
    first: dict[tuple[str, str], list[float]] = {}
    every: dict[tuple[str, str], list[float]] = {}
    for path in paths:
        s, eps = load(path), eps_of(path)
        print(f"{path}: {len(s['groups'])} groups tested, {s['detected']} detected")
        for fam in FAMILIES:
            cells = []
            for ep in ENTRYPOINTS:
                gs = [g for g in s["groups"] if g["family"] == fam and g["entrypoint"] == ep]
                if not gs:
                    cells.append("-")
                    continue
                det = sum(g["detected"] for g in gs)
                lo, hi = min(g["estimate"] for g in gs), max(g["estimate"] for g in gs)
                cells.append(f"{det}/{len(gs)} ({100 * lo:+.3f} .. {100 * hi:+.3f} %)")
                if eps is not None and det:
                    first.setdefault((fam, ep), []).append(eps)
                if eps is not None and det == len(gs):
                    every.setdefault((fam, ep), []).append(eps)
            print(f"| {fam} | " + " | ".join(cells) + " |")
    if first or every:
        print("smallest eps caught (some group / every tested group), per family and entrypoint:")
        for fam in FAMILIES:
            cells = []
            for ep in ENTRYPOINTS:
                a, b = first.get((fam, ep)), every.get((fam, ep))
                cells.append(f"{min(a) if a else 'none'} / {min(b) if b else 'none'}")
            print(f"| {fam} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
