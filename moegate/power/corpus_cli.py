"""``python -m moegate.power corpus check|run|report``: the real-bug corpus's command line (``moegate power corpus``).

    corpus check  --vllm-python PY [--site DIR]...          every re-plant applies to the installed vLLM, parses
                                                            and changes its file (no tests run)
    corpus run    --vllm-python PY [--site DIR]... --out DIR [--tiers dispatch|kernels,diff|...] [--jobs N]
                  [--budget-s S] [--timeout-s S] [--min-start-s S] [--only ID]... [--full]
                                                            each bug's build through `moegate gate` (moegate.power.corpus_run)
    corpus report RUN_DIR... [--out FILE]                   the page of one or more runs (moegate.power.corpus_report)
    corpus rescan RUN_DIR [--project-rev REV]               a run read again from its gates' logs and JUnit reports
                                                            (moegate.power.corpus_rescan; nothing re-run)

``--corpus FILE`` (each) reads another corpus than ``power/real-bugs.toml``. Exit status: 0 done (a run:
whatever the gates said, once the baseline passed and no survivor is unexplained; a report: the same of
every run it renders), 1 a void run or an unexplained survivor, 2 bad input (one line), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moegate.builds.planted import BuildError, make_build
from moegate.core.golden_files import atomic_write
from moegate.power.corpus import CORPUS, CorpusError, load, replant, select
from moegate.power.corpus_report import load_summary, passed, render
from moegate.power.corpus_rescan import corpus_of, rescan
from moegate.power.corpus_run import Plan, run
from moegate.power.errors import PowerError
from moegate.power.run import probe_package_dir

TIERS = ("dispatch", "dispatch,kernels", "dispatch,kernels,diff", "kernels", "kernels,diff")
"""What a corpus gate may run: the dispatch tier (a CPU can), the kernel tier (a GPU), and the differential tier against
the baseline's build (a GPU; it needs the kernel tier's leg). Kills by the dispatch tier are the CPU run's, so a GPU
run may leave it out (``kernels,diff``) and the report reads both runs."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m moegate.power corpus", description=(__doc__ or "").splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("check", "run"):
        s = sub.add_parser(name)
        s.add_argument("--vllm-python", required=True, help="the interpreter whose vLLM is re-planted (never written)")
        s.add_argument("--site", action="append", default=[], help="a directory first on the builds' path (repeatable)")
        s.add_argument("--corpus", type=Path, default=CORPUS)
        s.add_argument("--only", action="append", default=[], help="this bug only (repeatable)")
    r = sub.choices["run"]
    r.add_argument("--out", type=Path, required=True, help="where each bug's log, JUnit and result, and the summary go")
    r.add_argument("--tiers", default="dispatch", choices=TIERS, help="the gate's tiers (kernels and diff need a GPU)")
    r.add_argument("--jobs", type=int, default=1, help="gates side by side (at most 4 on one GPU)")
    r.add_argument("--budget-s", type=float, default=3600.0, help="wall seconds for the whole run")
    r.add_argument("--timeout-s", type=float, default=1800.0, help="wall seconds for one gate")
    r.add_argument("--min-start-s", type=float, default=120.0, help="no gate starts with less of the budget left")
    r.add_argument("--full", action="store_true", help="every test of every gate (default: stop at the first kill)")
    rep = sub.add_parser("report")
    rep.add_argument("runs", nargs="+", type=Path, help="run output folders (each with its summary.json)")
    rep.add_argument("--out", type=Path, default=None, help="the page (default: print it)")
    rep.add_argument("--corpus", type=Path, default=CORPUS)
    res = sub.add_parser("rescan")
    res.add_argument("run", type=Path, help="a run's output folder (its summary.json, and each bug's log and JUnit)")
    res.add_argument("--project-rev", default=None, help="the commit the run was made from (a copy without .git)")
    return p


def _check(args: argparse.Namespace) -> int:
    bugs = select(load(args.corpus), args.only)
    with tempfile.TemporaryDirectory(prefix="moegate-corpus-check-") as tmp:
        try:
            build = make_build(Path(tmp) / "build", args.vllm_python, sites=args.site)
        except BuildError as exc:
            raise PowerError(f"--vllm-python {args.vllm_python}: {exc}") from None
        package_dir, version = probe_package_dir(str(build))
    for bug in bugs:
        edited = replant(bug, package_dir)
        print(f"ok {bug.id}: {', '.join(sorted(edited))} ({len(bug.edits)} edit(s), {bug.upstream})")
    print(f"{len(bugs)} re-plants apply to vLLM {version} at {package_dir}", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if not 1 <= args.jobs <= 16:
        raise PowerError(f"--jobs {args.jobs}: between 1 and 16")
    if min(args.budget_s, args.timeout_s, args.min_start_s) <= 0:
        raise PowerError("--budget-s, --timeout-s and --min-start-s must be > 0")
    bugs = select(load(args.corpus), args.only)
    env = {"PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")}
    plan = Plan(
        vllm_python=args.vllm_python,
        sites=tuple(args.site),
        tiers=args.tiers,
        out=args.out,
        jobs=args.jobs,
        budget_s=args.budget_s,
        timeout_s=args.timeout_s,
        min_start_s=args.min_start_s,
        full=args.full,
        env=env,
        corpus=args.corpus,
        command=os.environ.get(
            "MOEGATE_CORPUS_COMMAND", "python -m moegate.power corpus " + " ".join(shlex.quote(a) for a in argv)
        ),
    )
    try:
        summary = run(plan, bugs)
    except BuildError as exc:
        raise PowerError(f"--vllm-python {args.vllm_python}: {exc}") from None
    print((args.out / "summary.md").read_text(encoding="utf-8"))
    return 0 if passed([summary], bugs) else 1


def _report(args: argparse.Namespace) -> int:
    bugs = load(args.corpus)
    try:
        summaries = [load_summary(r) for r in args.runs]
    except (OSError, ValueError) as exc:
        raise PowerError(f"cannot read a run's summary.json: {exc}") from None
    page = render(summaries, bugs)
    if args.out is None:
        print(page)
    else:
        atomic_write(args.out, page)
    return 0 if passed(summaries, bugs) else 1


def _rescan(args: argparse.Namespace) -> int:
    try:
        summary = rescan(args.run, args.project_rev)
    except (OSError, ValueError, KeyError) as exc:
        raise PowerError(f"{args.run}: not a corpus run's folder ({exc})") from None
    print((args.run / "summary.md").read_text(encoding="utf-8"))
    return 0 if passed([summary], corpus_of(summary)) else 1


def _term(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _term)  # a `timeout` around the run: every gate's process group is stopped
    try:
        if args.what == "check":
            return _check(args)
        if args.what == "run":
            return _run(args, argv)
        if args.what == "rescan":
            return _rescan(args)
        return _report(args)
    except (CorpusError, PowerError) as exc:
        print(f"moegate power corpus: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("moegate power corpus: interrupted; every gate stopped, installed vLLM files unchanged", file=sys.stderr)
        return 130
