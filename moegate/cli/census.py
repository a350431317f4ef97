"""``moegate census ...``: the census of vLLM's MoE configurations (``moegate/census``, docs/design/census.md).

Its arguments go unchanged to ``python -m moegate.census``: ``--check`` (the default), ``--bless``,
``--out FILE``, ``--vllm-root DIR``. ``moegate census paths [--golden FILE]`` prints the paths of vLLM's tree a
CI's path filter watches, one a line (``moegate/census/watch.py``), from the newest committed census golden
or the one given; no vLLM needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from moegate.census.__main__ import main as census_main
from moegate.census.watch import golden_paths


def paths(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="moegate census paths", description="the vLLM paths a CI's filter watches")
    parser.add_argument("--golden", type=Path, metavar="FILE", help="a census golden (default: the newest committed)")
    args = parser.parse_args(argv)
    try:
        found = golden_paths(args.golden)
    except OSError as exc:
        print(f"moegate census paths: {exc}", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as exc:
        print(f"moegate census paths: {args.golden}: not a census golden ({exc})", file=sys.stderr)
        return 2
    print("\n".join(found))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["paths"]:
        return paths(args[1:])
    return int(census_main(args) or 0)
