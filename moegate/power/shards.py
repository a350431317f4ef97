"""One power report from the shards of one run (``--shard K/N`` runs side by side, each with its ``power.json``).

A group's mutants split into N shards fit one device call each, or run side by side on one GPU
(``lab/gpu/offload_runs.sh power-all``). Each shard writes its own report; this joins them into the
group's report, the same page and JSON a single run writes. It refuses, in one line and writing nothing,
shards that are not of one run: another vLLM (version or installed files), another test command, group
or frozen suite, another N, a shard given twice or a mutant in two shards. A missing shard is reported
(``Outcome.missing_shards``) and keeps the report from passing: a score over part of the mutants is not
the group's score.

    moegate power join SHARD_DIR... --out DIR [--command "how the shards were run"]
    (python -m moegate.power join ...)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from moegate.paths import EQUIVALENT_MUTANTS
from moegate.power.errors import PowerError
from moegate.power.outcome import Mutant, Outcome, apply_equivalents, load_equivalents
from moegate.power.report import render_markdown, to_json

_SAME = ("vllm_version", "installed_hashes", "test_command", "groups", "suite_rev")


def from_json(data: dict[str, Any]) -> Outcome:
    """The outcome a ``power.json`` holds (``report.to_json``'s inverse; its derived keys are dropped)."""
    names = {f.name for f in dataclasses.fields(Outcome)}
    kept = {k: v for k, v in data.items() if k in names}
    kept["mutants"] = [Mutant(**m) for m in data.get("mutants", [])]
    return Outcome(**kept)


def load(shard_dir: Path) -> Outcome:
    path = shard_dir / "power.json"
    try:
        return from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        raise PowerError(f"{path}: no power.json (the shard did not finish)") from None
    except (ValueError, TypeError) as exc:
        raise PowerError(f"{path}: not a power report ({exc})") from None


def merge(outcomes: Sequence[Outcome], command: str = "", equivalents: Mapping[str, str] | None = None) -> Outcome:
    """The run the shards make together: every mutant once; the wall time of the longest shard.

    ``equivalents`` (id -> reason, the group's reviewed entries): applied to the joined survivors as a run applies
    them, so a review made after the run counts without running it again; ``None`` keeps each shard's own.
    """
    if not outcomes:
        raise PowerError("no shards to merge")
    first = outcomes[0]
    for o in outcomes[1:]:
        for key in _SAME:
            if getattr(o, key) != getattr(first, key):
                raise PowerError(
                    f"shards of different runs: {key} differs ({getattr(first, key)!r} vs {getattr(o, key)!r})"
                )
    shards: list[str] = []
    for o in outcomes:
        if len(o.shards) != 1:
            raise PowerError(f"an outcome that is not one shard (shards {o.shards or 'none: a whole run'})")
        shards.append(o.shards[0])
    if len({s.split("/")[1] for s in shards}) != 1:
        raise PowerError(f"shards of different splits: {', '.join(shards)}")
    if len(set(shards)) != len(shards):
        raise PowerError(f"a shard given twice: {', '.join(sorted(shards))}")
    mutants: list[Mutant] = []
    seen: dict[str, str] = {}
    for o, s in zip(outcomes, shards, strict=True):
        for m in o.mutants:
            if m.id in seen:
                raise PowerError(f"mutant {m.id} is in shards {seen[m.id]} and {s}")
            seen[m.id] = s
            mutants.append(m)
    if equivalents is None:
        stale = set(first.stale_equivalents)
        for o in outcomes[1:]:
            stale &= set(o.stale_equivalents)  # stale only where no shard met it
    else:
        mutants = [dataclasses.replace(m) for m in mutants]
        stale = set(apply_equivalents(mutants, equivalents))
    longest = max(outcomes, key=lambda o: o.wall_s)
    return dataclasses.replace(
        first,
        command=command or first.command,
        mutants=mutants,
        baseline=longest.baseline,
        wall_s=longest.wall_s,
        installed_unchanged=all(o.installed_unchanged for o in outcomes),
        stale_equivalents=sorted(stale),
        shards=sorted(shards, key=lambda s: int(s.split("/")[0])),
        cut="; ".join(f"shard {o.shards[0]} {o.cut}" for o in outcomes if o.cut),
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="moegate power join", description=__doc__.split("\n\n")[0])
    p.add_argument("shard_dirs", nargs="+", type=Path, help="each shard's --out folder (power.json inside)")
    p.add_argument("--out", required=True, type=Path, help="where the joined power.md and power.json go")
    p.add_argument("--command", default="", help="the command that ran the shards (the report's Command line)")
    p.add_argument(
        "--equivalents",
        type=Path,
        default=EQUIVALENT_MUTANTS,
        help="the reviewed equivalent mutants applied to the joined survivors (default: the project's)",
    )
    args = p.parse_args(argv)
    try:
        shards = [load(d) for d in args.shard_dirs]  # at least one: nargs="+"
        outcome = merge(shards, command=args.command, equivalents=load_equivalents(args.equivalents, shards[0].groups))
    except PowerError as exc:
        print(f"moegate power join: {exc}", file=sys.stderr)
        return 2
    md = render_markdown(outcome)
    args.out.mkdir(parents=True, exist_ok=True)
    tmp_md, tmp_js = args.out / "power.md.tmp", args.out / "power.json.tmp"
    tmp_md.write_text(md)
    tmp_js.write_text(json.dumps(to_json(outcome), indent=2, default=str))
    tmp_md.replace(args.out / "power.md")
    tmp_js.replace(args.out / "power.json")
    print(md)
    return 0 if outcome.passed else 1
