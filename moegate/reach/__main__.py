"""``python -m moegate.reach`` (``moegate reach``): what the dispatch and kernel tiers exercise of vLLM's fused MoE.

    python -m moegate.reach run [--tiers dispatch[,kernels]] [--out DIR] [--vllm-root DIR] [-- PYTEST_ARGS]
        the tiers under coverage.py, with the vLLM environment's Python (coverage.py installed in it):
        OUT/reach-<tiers>-<device>-<vllm>.json (docs/design/reach.md; nox -s reach; lab/gpu/reach.sh on a GPU)
    python -m moegate.reach report [RECORD.json ...] [--out DIR] [--check]
        the report from measured records (default: results/reach/*.json): results/reach.md and reach.json

Exit status: ``run``: 0 measured, 1 measured but the tiers failed (pytest's status is in the record), 2 a
vLLM whose layout the report does not know, or no coverage.py (one line, nothing written); ``report``:
0 written (or, with ``--check``, up to date), 1 with ``--check`` when the committed report differs from
the regenerated one, 2 unreadable input (one line, nothing written).
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moegate.census import census
from moegate.core.golden_files import atomic_write
from moegate.paths import REPORTS_DIR, RESULTS_DIR
from moegate.reach import branches, evaluate, reasons, report
from moegate.reach.layout import LayoutError, read
from moegate.reach.run import ReachError, measure, parse_tiers


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def run_main(argv: list[str]) -> int:
    own, pytest_args = _split(argv)
    p = argparse.ArgumentParser(prog="python -m moegate.reach run", description="the tiers under coverage.py")
    p.add_argument("--tiers", default="dispatch", help="dispatch (any machine) and/or kernels (a CUDA GPU)")
    p.add_argument("--out", type=Path, default=REPORTS_DIR / "reach", help="where the record goes")
    p.add_argument("--vllm-root", type=Path, default=None, help="the vllm folder (default: this Python's)")
    p.add_argument("--budget-s", type=float, default=None, help="interrupt the tiers after this long (still recorded)")
    args = p.parse_args(own)
    try:
        tiers = parse_tiers(args.tiers)
        layout = read(args.vllm_root)
        status = measure(layout, tiers, args.out, pytest_args, budget_s=args.budget_s)
    except (LayoutError, ReachError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return 0 if status == 0 else 1


def read_record(path: Path) -> str:
    """A measured record's text: the file as ``run`` writes it, or xz-compressed as the checkout keeps it."""
    return lzma.decompress(path.read_bytes()).decode() if path.suffix == ".xz" else path.read_text()


def committed_records(folder: Path) -> list[Path]:
    """The records in ``folder``: ``*.json`` and the ``*.json.xz`` the checkout keeps (a record is 0.5 MB of text)."""
    return sorted([*folder.glob("*.json"), *folder.glob("*.json.xz")])


def _load(paths: Sequence[Path]) -> list[dict[str, Any]]:
    records = []
    for path in paths:
        try:
            rec = json.loads(read_record(path))
        except (OSError, ValueError) as exc:
            raise ValueError(f"reach: cannot read the measured record {path} ({exc})") from exc
        if not isinstance(rec, dict) or "functions" not in rec or "tiers" not in rec:
            raise ValueError(f"reach: {path} is not a measured record of python -m moegate.reach run")
        rec["file"] = path.name
        records.append(rec)
    return records


def report_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m moegate.reach report", description="the report from measured records")
    p.add_argument("records", nargs="*", type=Path, help="measured records (default: results/reach/*.json[.xz])")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="where reach.md and reach.json.xz go")
    p.add_argument("--reasons", type=Path, default=reasons.REASONS, help=argparse.SUPPRESS)
    p.add_argument("--check", action="store_true", help="compare with the report in --out; write nothing")
    args = p.parse_args(argv)
    paths = args.records or committed_records(RESULTS_DIR / "reach")
    try:
        measured = evaluate.combine(_load(paths))
        golden = census.golden_path(measured.vllm)
        if not golden.is_file():
            raise ValueError(
                f"reach: no census golden for vLLM {measured.vllm} ({golden}): the requirements come from it"
            )
        records = census.parse_golden(golden.read_text())
        ev = evaluate.evaluate(measured, records, reasons.load(args.reasons))
    except (ValueError, evaluate.MeasuredError, reasons.ReasonsError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    name = str(golden.relative_to(golden.parents[2]))
    page = report.render_markdown(ev, name)
    data = branches.dumps(report.to_json(ev, name))
    md, js = args.out / "reach.md", args.out / "reach.json.xz"
    verdict = f"{'FAIL' if ev.problems else 'PASS'}: {len(ev.problems)} problem(s), {len(ev.pending)} not measured"
    if args.check:
        stale = [p.name for p, text in ((md, page), (js, data)) if not p.is_file() or read_record(p) != text]
        if stale:
            print(f"reach: {', '.join(stale)} in {args.out} is not what `{report.COMMAND}` makes now", file=sys.stderr)
            return 1
        print(f"reach: {md} and {js} are up to date ({verdict})")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(md, page)
    report.write_bytes(js, lzma.compress(data.encode(), preset=9))
    print(f"reach: wrote {md} and {js} ({verdict})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["run"]:
        return run_main(args[1:])
    if args[:1] == ["report"]:
        return report_main(args[1:])
    print(__doc__, file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout)
    return 0 if args[:1] in (["-h"], ["--help"]) else 2


if __name__ == "__main__":
    raise SystemExit(main())
