"""``python -m moegate.census``: take the census of the installed vLLM, check it against its golden or bless it.

    python -m moegate.census                  # check: compare with golden/census/vllm-<version>.jsonl
    python -m moegate.census --bless          # rewrite that golden (review `git diff golden/` after)
    python -m moegate.census --out FILE       # write the census to FILE (nothing compared)
    python -m moegate.census --vllm-root DIR  # a vLLM package folder instead of this Python's

Exit status: 0 the census matches (or was written), 1 it differs from the golden or the
golden is missing (the new census is written beside it as ``.obtained``, with the diff
on stderr), 2 the installed vLLM cannot be read (one line naming what was looked for
and where; nothing is written).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from moegate.census import census
from moegate.census.source import CensusError, locate
from moegate.core import golden_files
from moegate.core.golden_files import GoldenMismatch, GoldenMissing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moegate.census", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare with the committed golden (the default)")
    mode.add_argument("--bless", action="store_true", help="rewrite the golden of the installed release")
    mode.add_argument("--out", type=Path, metavar="FILE", help="write the census to FILE")
    parser.add_argument("--vllm-root", type=Path, metavar="DIR", help="the vllm package folder to read")
    parser.add_argument("--golden-dir", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # tests
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    try:
        src = locate(args.vllm_root)
        text = census.render(census.take(src))
    except CensusError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    took = time.perf_counter() - t0
    if args.out is not None:
        golden_files.atomic_write(args.out, text)
        print(f"census of vLLM {src.version} ({src.root}): {args.out} in {took:.1f} s", file=sys.stderr)
        return 0
    name = census.golden_name(src.version)
    directory = args.golden_dir or golden_files.GOLDEN_DIR
    try:
        golden_files.check(name, text, bless=args.bless, directory=directory, hint=census.BLESS)
    except (GoldenMismatch, GoldenMissing) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    verb = "blessed" if args.bless else "matches"
    print(f"census of vLLM {src.version} ({src.root}) {verb} {directory / name} ({took:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
