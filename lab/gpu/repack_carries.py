"""Regroup offline bundles' parts into carries that fit one device call beside the checkout.

    python3 -m lab.gpu.repack_carries OUTDIR --max-mb 42 BUNDLE=SITE... [--first-mb 37]

Each ``BUNDLE`` is a folder of ``partN/`` (``../shared/tools/vllm-offline-bundle.sh`` or
``gpu-wheelhouse.sh``: chunks, ``MANIFEST``, ``install.sh`` that stages what it has and assembles
once every chunk in the manifest is there). Its chunk files are cut, in order, into pieces named
``BASE.chunkNNN`` (three digits, so that ``cat BASE.chunk*`` still reads them in order) and
distributed over ``OUTDIR/cK/`` folders of at most ``--max-mb`` MB (``--first-mb`` for ``c1``, which
travels with the data); each ``cK/TAG/`` holds the bundle's ``install.sh``, the full new
``MANIFEST`` and its pieces. ``OUTDIR/cK/install.sh`` installs all of a carry's bundles into their
``SITE`` (under ``$HOME``). The bytes are checked: each bundle's pieces, joined, equal its chunks.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
from pathlib import Path

CHUNK = re.compile(r"^(?P<base>.+)\.chunk(?P<n>\d+)$")


def chunks(bundle: Path) -> list[Path]:
    """The bundle's chunk files in assembly order (base, then chunk number)."""
    files = [p for part in sorted(bundle.glob("part*")) for p in part.iterdir() if CHUNK.match(p.name)]

    def key(p: Path) -> tuple[str, int]:
        m = CHUNK.match(p.name)
        assert m is not None
        return m["base"], int(m["n"])

    return sorted(files, key=key)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("bundles", nargs="+", help="BUNDLE_DIR=SITE_NAME")
    ap.add_argument("--max-mb", type=float, default=42.0)
    ap.add_argument("--first-mb", type=float, default=None)
    args = ap.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    limits = [int((args.first_mb or args.max_mb) * 1e6)]
    carry, used = 1, 0
    plan: dict[int, dict[str, str]] = {}
    for spec in args.bundles:
        src, _, site = spec.partition("=")
        bundle = Path(src)
        tag = bundle.name
        files = chunks(bundle)
        if not files or not site:
            print(f"repack_carries: {spec}: no chunks, or no SITE", file=sys.stderr)
            return 2
        install = next(bundle.glob("part*/install.sh"))
        names: list[str] = []
        counters: dict[str, int] = {}
        pieces: list[tuple[int, str, Path, int, int]] = []
        for f in files:
            m = CHUNK.match(f.name)
            assert m is not None
            size, off = f.stat().st_size, 0
            while off < size:
                limit = limits[carry - 1] if carry <= len(limits) else int(args.max_mb * 1e6)
                room = limit - used
                if room <= 0:
                    carry, used = carry + 1, 0
                    continue
                n = min(room, size - off)
                k = counters.get(m["base"], 0)
                counters[m["base"]] = k + 1
                name = f"{m['base']}.chunk{k:03d}"
                pieces.append((carry, name, f, off, n))
                names.append(name)
                off += n
                used += n
        for c, name, f, off, n in pieces:
            d = args.out / f"c{c}" / tag
            d.mkdir(parents=True, exist_ok=True)
            with open(f, "rb") as fh:
                fh.seek(off)
                (d / name).write_bytes(fh.read(n))
            shutil.copy(install, d / "install.sh")
            (d / "MANIFEST").write_text("".join(x + "\n" for x in names))
            plan.setdefault(c, {})[tag] = site
        whole = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
        again = hashlib.sha256(b"".join((args.out / f"c{c}" / tag / name).read_bytes() for c, name, *_ in pieces))
        if whole != again.hexdigest():
            print(f"repack_carries: {tag}: the pieces do not join to the chunks", file=sys.stderr)
            return 2
    for c, tags in sorted(plan.items()):
        lines = ["#!/usr/bin/env bash", "set -euo pipefail", 'here=$(cd "$(dirname "$0")" && pwd)']
        lines += [f'bash "$here/{tag}/install.sh" "$HOME/{site}"' for tag, site in tags.items()]
        (args.out / f"c{c}" / "install.sh").write_text("\n".join(lines) + "\n")
        size = sum(p.stat().st_size for p in (args.out / f"c{c}").rglob("*") if p.is_file())
        print(f"c{c}: {size / 1e6:.1f} MB: {', '.join(f'{t} -> $HOME/{s}' for t, s in tags.items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
