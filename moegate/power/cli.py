"""Gate power: mutation-test vLLM's fused-MoE code and measure how fast the suite kills each mutant.

The command line of ``python -m moegate.power``: it runs one power run, writes
``power.md`` / ``power.json`` (and appends the page to ``$GITHUB_STEP_SUMMARY``),
and exits 0 when every mutant is killed or reviewed equivalent, 1 when not, 2 on a
broken run (one line saying why), 130 when interrupted. ``python -m moegate.power join SHARD_DIR... --out DIR``
joins the reports of one run's ``--shard K/N`` runs into the group's report (``moegate.power.shards``);
``python -m moegate.power corpus check|run|report`` runs the real-bug corpus (``moegate.power.corpus_cli``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moegate.paths import REPORTS_DIR
from moegate.power.corpus_cli import main as corpus
from moegate.power.errors import PowerError
from moegate.power.regions import GROUPS, group_specs
from moegate.power.report import render_markdown, to_json
from moegate.power.run import run
from moegate.power.shards import main as join


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["join"]:
        return join(args_in[1:])
    if args_in[:1] == ["corpus"]:
        return corpus(args_in[1:])
    p = argparse.ArgumentParser(prog="python -m moegate.power", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument(
        "--vllm-python", required=True, help="Python of the environment whose installed vLLM is mutated (never written)"
    )
    p.add_argument("--out", default=str(REPORTS_DIR), help="where power.md / power.json / the tool log go")
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds per mutant (default: max(60, 4x the unmutated tier))"
    )
    p.add_argument("--limit", type=int, default=None, help="run only the first N mutants in scope (smoke runs)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only the mutant with this id (repeatable), e.g. to re-check survivors",
    )
    p.add_argument(
        "--test-command",
        default=None,
        help="override the per-mutant test command (tests of this harness); {python} in it is the test build's"
        " interpreter, which sees the overlay and the frozen suite first",
    )
    p.add_argument(
        "--package-dir", default=None, help="the vllm package directory (default: probed from --vllm-python)"
    )
    p.add_argument(
        "--budget",
        type=float,
        default=30.0,
        help="per-mutant time-to-first-failure target, seconds (reported, not enforced)",
    )
    p.add_argument(
        "--regions",
        default="dispatch",
        help=f"region groups to mutate, comma-separated, of {', '.join(GROUPS)} (default: dispatch)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the mutants in scope and stop (no tests run)")
    p.add_argument(
        "--prune-unreached",
        action="store_true",
        help="trace one unmutated run; mutants on lines it never executes are 'unreached' survivors, not run",
    )
    p.add_argument("--shard", default=None, help="K/N: run every N-th mutant in scope from the K-th (0-based)")
    args = p.parse_args(args_in)

    def _term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with SIGINT ignored
    out_dir = Path(args.out)
    groups = [g for g in args.regions.split(",") if g]
    try:
        try:
            specs = group_specs(groups)
        except ValueError as exc:
            raise PowerError(f"--regions {args.regions}: {exc}") from None
        shard = None
        if args.shard is not None:
            k, sep, n = args.shard.partition("/")
            if not (sep and k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
                raise PowerError(f"--shard {args.shard}: expected K/N with 0 <= K < N, e.g. 0/3")
            shard = (int(k), int(n))
        outcome = run(
            args.vllm_python,
            out_dir=out_dir,
            package_dir=Path(args.package_dir) if args.package_dir else None,
            test_command=args.test_command,
            timeout_s=args.timeout,
            limit=args.limit,
            only=args.only,
            command=os.environ.get(
                "MOEGATE_POWER_COMMAND",
                "python -m moegate.power "
                + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
            ),
            budget_s=args.budget,
            specs=specs,
            groups=groups,
            dry_run=args.dry_run,
            prune_unreached=args.prune_unreached,
            shard=shard,
        )
    except PowerError as exc:
        print(f"moegate power: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(
            f"moegate power: interrupted ({exc or 'SIGINT'}); overlay removed, installed vLLM files unchanged",
            file=sys.stderr,
        )
        return 130
    if args.dry_run:
        for m in outcome.mutants:
            print(f"{m.id}\tline {m.line}\t{m.region}")
        print(
            f"{len(outcome.mutants)} mutants in {len(outcome.regions)} regions ({', '.join(groups)})", file=sys.stderr
        )
        return 0
    md = render_markdown(outcome)
    (out_dir / "power.md").write_text(md)
    (out_dir / "power.json").write_text(json.dumps(to_json(outcome), indent=2, default=str))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as fh:
            fh.write(md)
    print(md)
    return 0 if outcome.passed else 1
