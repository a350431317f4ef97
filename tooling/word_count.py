"""The words a user reads: the README and every page of docs/ outside docs/design/ (issue 46: at most 8,000).

    python -m tooling.word_count            # each page's words and the total
    python -m tooling.word_count --check    # the same; exit 1, with one line, above the limit

A word is what ``wc -w`` counts: a run of characters between whitespace, in the Markdown as written (code, tables
and link targets included). The derivations and measurement narratives under ``docs/design/`` are a maintainer's
reading and are not counted; the figure and the commit it was taken at live in results/README.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

LIMIT = 8000
"""The most words the user's pages may hold."""
PAGES = ("README.md", "docs/**/*.md")
DESIGN = "docs/design/"
"""Out of a user's path: not counted."""
ROOT = Path(__file__).resolve().parent.parent


def user_pages(root: Path | None = None) -> list[Path]:
    root = root or ROOT
    found = {p for pattern in PAGES for p in root.glob(pattern)}
    return sorted(p for p in found if not p.relative_to(root).as_posix().startswith(DESIGN))


def words(text: str) -> int:
    return len(text.split())


def count(root: Path | None = None) -> dict[str, int]:
    """Words per user page, by its path in the checkout."""
    root = root or ROOT
    return {p.relative_to(root).as_posix(): words(p.read_text(encoding="utf-8")) for p in user_pages(root)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.word_count", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help=f"exit 1 when the total is above {LIMIT:,}")
    args = ap.parse_args(argv)
    pages = count()
    total = sum(pages.values())
    for page, n in pages.items():
        print(f"{n:>7,}  {page}")
    print(f"{total:>7,}  total (limit {LIMIT:,})")
    if args.check and total > LIMIT:
        print(f"the user's pages hold {total:,} words, over the {LIMIT:,} limit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
