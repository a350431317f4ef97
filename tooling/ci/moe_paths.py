"""The vLLM paths that reach the fused MoE, generated from the census: which pull requests get the GPU legs.

    python -m tooling.ci.moe_paths                 # print the list this census gives
    python -m tooling.ci.moe_paths --write         # rewrite tooling/ci/moe-paths.txt (commit it with the census)
    python -m tooling.ci.moe_paths --check         # exit 1 when the committed list is not the census's
    git diff --name-only BASE HEAD | python -m tooling.ci.moe_paths match   # the changed files that reach it

The list is made, not kept by hand (issue 44), from two sources:

- the newest committed census (``golden/census/vllm-<version>.jsonl``, reviewed per release: docs/design/census.md): the
  builder's package (the fused-MoE package: its experts, configs, tuned tiles), every model file that builds a
  fused-MoE layer (``layer``), every MoE quantization method (``quant-method``) and every dispatch site (``site``);
- what the census reads whole or beside its records (its own constants): the registry that maps an architecture to
  its model file, and vLLM's config classes, which pin a layer's shape;
- ``moegate.dispatch.names``, where moegate spells every vLLM module it relies on: the UVA offloader's package and the
  loader's post-processing (``device_loading_context`` re-offloads what lost its marker).

The census reads the installed Python package; it cannot see vLLM's C++ sources. The census room's list maps the
extension the fused-MoE ops live in (``torch.ops._moe_C``: the block alignment, top-k softmax and sum, the MoE
GEMMs; 0.33.0 calls it from ``_custom_ops.py`` and ``fused_moe/``) to the folder it is compiled from. A path
ending in ``/`` is a folder: every file under it reaches the fused MoE.

``match`` reads changed paths (one a line; a rename's old and new path both count) and prints those that reach the
fused MoE; with ``--github-output`` it also writes ``moe=true|false`` and ``tiers=`` (``--all`` when any path
reaches it, else ``dispatch``) to ``$GITHUB_OUTPUT``. Standard library only: the caller's ``changes`` job runs it
with the runner's python3 from a moegate checkout. Exit status 0; 2 with one line for bad input (no census, an
unreadable list).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from moegate.census.census import GOLDEN_DIR as CENSUS_FOLDER
from moegate.census.census import parse_golden
from moegate.census.watch import newest_golden, watched_paths
from moegate.core import golden_files
from moegate.core.golden_files import atomic_write

ROOT = Path(__file__).resolve().parent.parent.parent
LIST = Path(__file__).resolve().parent / "moe-paths.txt"
GPU_TIERS_DEFAULT = "dispatch,kernels,e2e,ab"


class PathsError(ValueError):
    """Bad input: one line, exit 2."""


def newest_census(golden_dir: Path | None = None) -> Path:
    """The census room's newest committed golden (``moegate.census.watch.newest_golden``: the release under review,
    as ``moegate census paths`` and ``moegate buildkite`` take it); ``PathsError`` when there is none."""
    try:
        return newest_golden(golden_dir)
    except FileNotFoundError:
        folder = (golden_dir or golden_files.GOLDEN_DIR) / CENSUS_FOLDER
        raise PathsError(
            f"no census in {folder} (golden/census/vllm-<version>.jsonl: python -m moegate.census)"
        ) from None


def generate(census: Path) -> list[str]:
    """The paths, sorted; a file under a listed folder is left out (the folder covers it): the census room's one list
    (``moegate.census.watch``, which ``moegate census paths`` and ``moegate buildkite`` print too)."""
    try:
        records = parse_golden(census.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PathsError(f"{census}: not a census ({exc})") from None
    if not any(rec.get("kind") == "builder" for rec in records):
        raise PathsError(f"{census}: no builder record, so no fused-MoE package to list")
    return watched_paths(records)


def render(census: Path, paths: Iterable[str]) -> str:
    rel = census.relative_to(ROOT) if census.is_relative_to(ROOT) else census
    header = [
        "# The vLLM paths that reach the fused MoE: a pull request touching one gets the GPU legs.",
        f"# Generated from {rel.as_posix()} and moegate/dispatch/names.py by `python -m tooling.ci.moe_paths --write`;",
        "# do not edit (tests/unit/tooling/test_moe_paths.py fails when it differs). A path ending in / is a folder.",
    ]
    return "\n".join([*header, *paths]) + "\n"


def read_list(path: Path = LIST) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PathsError(f"{path}: cannot read the MoE path list ({exc.strerror})") from None
    found = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if not found:
        raise PathsError(f"{path}: the MoE path list is empty")
    return found


def reaching(changed: Iterable[str], moe_paths: Iterable[str]) -> list[str]:
    """The changed paths that are, or lie under, a path of the list."""
    listed = list(moe_paths)
    return sorted({p for p in changed if any(p == m or (m.endswith("/") and p.startswith(m)) for m in listed)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.ci.moe_paths", description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", choices=["match"], help="match: the changed paths (stdin) that reach it")
    ap.add_argument("--census", type=Path, help="a census file (default: the newest in golden/census/)")
    ap.add_argument("--list", type=Path, default=LIST, help="the committed list (match, --check)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite {LIST.name}")
    mode.add_argument("--check", action="store_true", help=f"exit 1 when {LIST.name} is not the census's list")
    ap.add_argument("--github-output", action="store_true", help="match: write moe= and tiers= to $GITHUB_OUTPUT")
    ap.add_argument("--all", default=GPU_TIERS_DEFAULT, help="match: the tiers when a path reaches the fused MoE")
    args = ap.parse_args(argv)
    try:
        if args.command == "match":
            return _match(args)
        census = args.census or newest_census()
        text = render(census, generate(census))
    except PathsError as exc:
        print(f"moegate: {exc}", file=sys.stderr)
        return 2
    if args.write:
        atomic_write(args.list, text)
        print(f"{args.list}: {len(text.splitlines()) - 3} paths from {census.name}", file=sys.stderr)
    elif args.check:
        if not args.list.is_file() or args.list.read_text(encoding="utf-8") != text:
            print(
                f"{args.list} is not what {census.name} gives: python -m tooling.ci.moe_paths --write", file=sys.stderr
            )
            return 1
    else:
        sys.stdout.write(text)
    return 0


def _match(args: argparse.Namespace) -> int:
    changed = [ln.strip() for ln in sys.stdin.read().splitlines() if ln.strip()]
    hits = reaching(changed, read_list(args.list))
    for hit in hits:
        print(hit)
    tiers = args.all if hits else "dispatch"
    print(f"{len(hits)} of {len(changed)} changed paths reach the fused MoE: tiers {tiers}", file=sys.stderr)
    if args.github_output and os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as fh:
            fh.write(f"moe={str(bool(hits)).lower()}\ntiers={tiers}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
