"""How many bytes the checkout tracks outside ``models/``: ``python -m tooling.tree_bytes [--limit BYTES]``.

The checkout is the product: every clone, every CI job and every copy of the tree sent to a GPU machine carries
it whole. The measured runs' raw archives left it (``results/archives.md`` names each by commit, path and
sha256), so what is tracked is code, docs, goldens, results pages and the small data a page or a test re-renders
from; the trained tiny model (``models/``) is counted apart, as the e2e tier's input. The figure and its command:
``results/house.md``; ``tests/unit/test_tree_bytes.py`` holds the limit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

LIMIT = 5_000_000
"""Bytes tracked outside ``models/`` (issue 46: the lab's archives out of the product)."""


def tracked_bytes(root: Path, exclude: tuple[str, ...] = ("models/",)) -> dict[str, int]:
    """Each tracked file's size in bytes, by path, leaving out paths under ``exclude``."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    sizes = {}
    for raw in out.split(b"\0"):
        path = raw.decode()
        if path and not path.startswith(exclude) and (root / path).is_file():
            sizes[path] = (root / path).stat().st_size
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.tree_bytes", description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--limit", type=int, default=LIMIT)
    ap.add_argument("--top", type=int, default=5, help="name the largest files too")
    args = ap.parse_args(argv)
    try:
        sizes = tracked_bytes(args.root)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"tree_bytes: {args.root} is not a git checkout ({exc})", file=sys.stderr)
        return 2
    total = sum(sizes.values())
    for path, size in sorted(sizes.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{size:>10,}  {path}")
    print(f"{total:,} bytes tracked outside models/ in {len(sizes)} files (limit {args.limit:,})")
    return 0 if total <= args.limit else 1


if __name__ == "__main__":
    sys.exit(main())
