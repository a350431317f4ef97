"""``moegate preflight``: the runner's checks, each one line, a JSON report whole or not at all (the package docstring
says what each check is for)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from moegate.preflight.checks import check_disk, check_driver, check_gpu, disk_root
from moegate.preflight.needs import DEFAULT_PINNED_GIB, LEGS, pinned_need
from moegate.preflight.report import PreflightError, Report

DEFAULT_DISK_GIB = 30.0
CHECKS = ("driver", "gpu", "disk")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="moegate preflight", description="can this runner run the GPU tiers?")
    ap.add_argument("--json", type=Path, help="write the report here (the A/B's --preflight reads it)")
    ap.add_argument("--checks", default="gpu,disk", help="comma list of driver, gpu, disk (default gpu,disk)")
    ap.add_argument("--model", action="append", default=[], help="a model the legs serve (repeat): the pinned need")
    ap.add_argument(
        "--need-pinned-gib",
        type=float,
        help=f"pinned GiB the legs need (default {DEFAULT_PINNED_GIB:g}; added to --model's)",
    )
    ap.add_argument(
        "--leg", action="append", default=[], help=f"a leg this GPU runs ({', '.join(LEGS)}; repeat): free GPU memory"
    )
    ap.add_argument("--need-disk-gib", type=float, default=DEFAULT_DISK_GIB)
    ap.add_argument("--disk-path", type=Path, help="where the environments go (default: $MOEGATE_ENV_DIR or ~/.cache)")
    ap.add_argument("--uva-gib", type=float, default=1.0, help="GiB read per bandwidth measurement")
    ap.add_argument("--repeats", type=int, default=5)
    return ap


def run(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> tuple[Report, argparse.Namespace]:
    """Every check, each printed through ``out`` as it completes; the report and the parsed options."""
    opts = parser().parse_args(argv)
    for name in ("need_pinned_gib", "need_disk_gib", "uva_gib"):
        value = getattr(opts, name)
        if value is not None and (value < 0 or (name == "uva_gib" and value == 0)):
            raise PreflightError(f"--{name.replace('_', '-')} must be positive, not {value}")
    if opts.repeats < 1:
        raise PreflightError(f"--repeats must be at least 1, not {opts.repeats}")
    checks = [c.strip() for c in opts.checks.split(",") if c.strip()]
    unknown = [c for c in checks if c not in CHECKS]
    if unknown or not checks:
        raise PreflightError(f"--checks {opts.checks!r}: choose from {', '.join(CHECKS)}")
    bad_leg = [leg for leg in opts.leg if leg not in LEGS]
    if bad_leg:
        raise PreflightError(f"--leg {bad_leg[0]!r}: choose from {', '.join(LEGS)}")
    opts.need_pinned_gib, opts.pinned_why = pinned_need(opts.model, opts.need_pinned_gib)
    report = Report()
    if "driver" in checks:
        check_driver(report, out)
    if "gpu" in checks:
        check_gpu(report, opts, out)
    if "disk" in checks:
        check_disk(report, opts.disk_path or disk_root(), opts.need_disk_gib, out)
    return report, opts


def main(argv: Sequence[str] | None = None) -> int:
    try:
        report, opts = run(argv)
    except PreflightError as exc:
        print(f"moegate preflight: {exc}", file=sys.stderr)
        return 2
    if opts.json:
        tmp = opts.json.with_name(opts.json.name + ".tmp")
        tmp.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(opts.json)  # whole or not at all
    failed = [c.name for c in report.checks if c.status == "FAIL"]
    print(f"preflight: {'PASS' if not failed else 'FAIL (' + ', '.join(failed) + ')'}")
    return 0 if not failed else 1
