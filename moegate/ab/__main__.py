"""python -m moegate.ab: throughput A/B of two vLLM builds, or the report of a finished run.

    python -m moegate.ab --base-python PY --pr-python PY --model DIR [--server-args "..."]
        [--dataset-path SHAREGPT.json | --random-input-len N] [--output-len 128]
        [--min-starts 3] [--starts 5] [--concurrency 1,2,3,4,8,16] [--target-seconds 30] [--out DIR]
        [--preflight PREFLIGHT.json] [--gate]
    python -m moegate.ab --report-only RUN_DIR [--gate] [--moe-shape ...]

The verdict judges the decode time a token per level, starts added round by round from ``--min-starts``
until every level is settled or ``--starts`` (``docs/design/ab.md``). Exit status: 0, or 1 when ``--gate`` is
given and the gate fails (or ``--expect-same`` and a level claims a difference), 2 on bad input (one line).
The report is also appended to ``$GITHUB_STEP_SUMMARY`` when that is set.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from moegate.ab import report as report_mod
from moegate.ab.driver import Driver
from moegate.ab.evidence import DEFAULT_PEAK_SOURCE, MoEShape, TrafficModel, load_routing, uva_peak
from moegate.ab.plan import Dataset, DriverError, Plan, Run, load_run
from moegate.ab.rule import DEFAULT_ALPHA, DEFAULT_MARGIN
from moegate.ab.verdict import DEFAULT_GATE_THRESHOLD
from moegate.core.golden_files import atomic_write
from moegate.paths import REPORTS_DIR
from moegate.serve.build import Build, env_pairs, positive_ints
from moegate.serve.server import teardown_on_termination


def _env(pairs: list[str]) -> dict[str, str]:
    try:
        return env_pairs(pairs)
    except ValueError as exc:
        raise DriverError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m moegate.ab", description=__doc__.splitlines()[0])
    for role in ("base", "pr"):
        g = p.add_argument_group(f"{role} build")
        g.add_argument(f"--{role}-python", help=f"interpreter of the {role} build's environment (vLLM imports there)")
        g.add_argument(f"--{role}-label", default=role)
        g.add_argument(f"--{role}-env", action="append", default=[], metavar="KEY=VALUE")
        g.add_argument(f"--{role}-server-args", default="", help="flags only this build's servers get (shell words)")
    p.add_argument("--model", help="model directory (or name) both servers serve")
    p.add_argument("--tokenizer", help="tokenizer for the benchmark client (default: the model)")
    p.add_argument("--served-name", help="name the server serves the model under")
    p.add_argument("--server-args", default="", help="flags every server start gets (shell words)")
    p.add_argument(
        "--starts", type=int, default=5, help="the cap: server starts a build the run may grow to (default 5)"
    )
    p.add_argument(
        "--min-starts",
        type=int,
        help="starts a build at the first look (default min(3, --starts)); a round is added after each look "
        "until every level is settled or the cap",
    )
    p.add_argument(
        "--vary-prompts", action="store_true", help="other prompts each round (default: the same every round)"
    )
    p.add_argument("--concurrency", type=positive_ints, default=(1, 2, 3, 4, 8, 16))
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--dataset-path", help="a valid ShareGPT JSON list (moegate/e2e/prompts.py writes one)")
    p.add_argument("--random-input-len", type=int, help="use vLLM's random dataset with this prompt length")
    p.add_argument("--target-seconds", type=float, default=30.0, help="measured seconds per level (sizing)")
    p.add_argument("--min-rounds", type=int, default=4, help="floor: prompts per level >= rounds x c")
    p.add_argument("--warmup-rounds", type=int, default=2)
    p.add_argument(
        "--prompts", type=positive_ints, help="fixed prompts per level (one per --concurrency level), no sizing"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bench-arg", action="append", default=[], help="extra vllm bench serve argument (repeat)")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--bench-timeout", type=float, default=3600.0)
    p.add_argument("--out", type=Path, help="run folder (default reports/ab-<time>)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the schedule of --out's run.json (same plan; --starts may grow by whole rounds)",
    )
    p.add_argument("--max-new-starts", type=int, help="stop after this many starts (resume later with --resume)")
    p.add_argument("--report-only", type=Path, metavar="RUN_DIR", help="recompute the report of a finished run")
    v = p.add_argument_group("verdict")
    v.add_argument(
        "--gate",
        action="store_true",
        help="exit 1 on a FAIL level, on a regressed one at least --gate-threshold slower, or on a run not over",
    )
    v.add_argument(
        "--gate-threshold", type=float, default=DEFAULT_GATE_THRESHOLD, help="decode slow-down that fails (0.03)"
    )
    v.add_argument("--alpha", type=float, help=f"family-wise, over levels and looks (default {DEFAULT_ALPHA})")
    v.add_argument("--margin", type=float, help=f"equivalent: no change this large (default {DEFAULT_MARGIN})")
    v.add_argument(
        "--expect-same",
        action="store_true",
        help="an A/A run (one build as A and B): exit 1 when a level is improved, regressed or FAIL",
    )
    t = p.add_argument_group("evidence (traffic model)")
    t.add_argument(
        "--moe-shape",
        help="experts=E,top_k=K,hidden=H,intermediate=I,layers=L[,dtype=bf16] "
        "(default: read from the model's config.json)",
    )
    t.add_argument("--host-fraction", type=float, help="fraction of experts UVA-offloaded (default 1.0)")
    t.add_argument(
        "--preflight",
        type=Path,
        metavar="FILE",
        help="the runner's preflight JSON (moegate preflight --json): its uva_read_gbps sets the UVA read bandwidth",
    )
    t.add_argument("--uva-peak-gbps", type=float, help="the UVA read bandwidth, GB/s, when no preflight measured it")
    t.add_argument("--routing", type=Path, help='routing sample JSON {"c": [step: [token: [ids]]]}')
    t.add_argument(
        "--host-sorted",
        choices=("pr", "both", "none"),
        help="which builds take the sorted path for host-resident weights (have vLLM PR #62054's rule; "
        "default: the PR build only; 'both' for a same-build run of 0.33.0, 'none' of 0.32.0)",
    )
    t.add_argument("--no-evidence", action="store_true", help="no traffic columns (e.g. a CPU run: no PCIe)")
    return p


PREFLIGHT_COPY = "preflight.json"
"""The preflight file a run was given, kept in its folder, so a report recomputed later names the same figure."""
EVIDENCE_COPY = "evidence.json"
"""The evidence columns' other inputs a run was reported with (MoE shape, host fraction, which builds sort, a
bandwidth given by hand), kept in its folder: a report recomputed away from the model (a CI artifact on a laptop)
has no config.json to read the shape from."""
ROUTING_COPY = "routing.json"
"""The routing sample a run was reported with, kept in its folder for the same reason."""


def _kept_evidence(folder: Path) -> dict[str, Any]:
    try:
        kept = json.loads((folder / EVIDENCE_COPY).read_text())
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


HOST_SORTED = {
    "pr": {"base": False, "pr": True},
    "both": {"base": True, "pr": True},
    "none": {"base": False, "pr": False},
}
"""--host-sorted -> which builds have the PR's rule (host-resident weights always sorted)."""


def _keep_evidence(folder: Path, opts: argparse.Namespace, traffic: TrafficModel) -> None:
    """What a later ``--report-only`` needs to draw the same evidence columns; each file written whole."""
    if opts.routing is not None and Path(opts.routing).resolve() != (folder / ROUTING_COPY).resolve():
        atomic_write(folder / ROUTING_COPY, Path(opts.routing).read_text())
    kept = {
        "shape": asdict(traffic.shape),
        "host_fraction": traffic.host_fraction,
        "host_sorted": next(k for k, rule in HOST_SORTED.items() if rule == traffic.sorted_always),
        "uva_peak_gbps": opts.uva_peak_gbps,
        "routing": opts.routing is not None,
    }
    atomic_write(folder / EVIDENCE_COPY, json.dumps(kept, indent=1) + "\n")


def _traffic(opts: argparse.Namespace, model: str | None, folder: Path) -> TrafficModel | None:
    """The evidence columns' model: each input from the command line, else from the model's config.json (the
    shape), else as the run folder kept it (``evidence.json``, ``routing.json``, ``preflight.json``), else the
    default."""
    if opts.no_evidence:
        return None
    kept = _kept_evidence(folder)
    shape = MoEShape.parse(opts.moe_shape) if opts.moe_shape else (MoEShape.from_config(model) if model else None)
    if shape is None and "shape" in kept:
        try:
            shape = MoEShape(**kept["shape"])
        except TypeError:
            raise DriverError(f"{folder / EVIDENCE_COPY}: its 'shape' is not a MoE shape ({kept['shape']!r})") from None
    if shape is None:
        # said, not silent: a report recomputed away from the model has no config.json to read
        print(
            f"moegate.ab: no evidence columns: no MoE shape in {model}/config.json; give --moe-shape "
            "(or --no-evidence to drop them on purpose)",
            file=sys.stderr,
        )
        return None
    preflight, given = opts.preflight, opts.uva_peak_gbps
    if preflight is None and given is None:
        if (folder / PREFLIGHT_COPY).is_file():
            preflight = folder / PREFLIGHT_COPY
        elif isinstance(kept.get("uva_peak_gbps"), (int, float)):
            given = float(kept["uva_peak_gbps"])
    gbps, source = uva_peak(preflight, given)
    if source == DEFAULT_PEAK_SOURCE:
        print(f"moegate.ab: UVA read bandwidth {gbps:g} GB/s, {source}", file=sys.stderr)
    routing_path = opts.routing
    if routing_path is None and kept.get("routing") and (folder / ROUTING_COPY).is_file():
        routing_path = folder / ROUTING_COPY
    routing = load_routing(routing_path) if routing_path else None
    fraction = opts.host_fraction if opts.host_fraction is not None else float(kept.get("host_fraction", 1.0))
    choice = opts.host_sorted or kept.get("host_sorted") or "pr"
    if choice not in HOST_SORTED:
        raise DriverError(f"{folder / EVIDENCE_COPY}: host_sorted {choice!r} is none of {', '.join(HOST_SORTED)}")
    rule = HOST_SORTED[choice]
    return TrafficModel(shape, fraction, gbps, routing, sorted_always=rule, peak_source=source)


def _build(role: str, opts: argparse.Namespace) -> Build:
    py = getattr(opts, f"{role}_python")
    if not py:
        raise DriverError(f"--{role}-python is required (the interpreter of the {role} build's environment)")
    fields = {
        "label": getattr(opts, f"{role}_label"),
        "python": py,
        "env": _env(getattr(opts, f"{role}_env")),
        "server_args": tuple(shlex.split(getattr(opts, f"{role}_server_args"))),
    }
    return Build(**fields)


def main(argv: list[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    with teardown_on_termination():  # a killed driver must not leave a server holding the GPU
        return _main(opts)


def plan_of(opts: argparse.Namespace) -> Plan:
    """The run's plan from the command line (DriverError, one line, when it does not hold)."""
    prompts = None
    if opts.prompts:
        if len(opts.prompts) != len(opts.concurrency):
            raise DriverError(f"--prompts has {len(opts.prompts)} values for {len(opts.concurrency)} levels")
        prompts = dict(zip(opts.concurrency, opts.prompts))
    return Plan(
        concurrency=opts.concurrency,
        starts=opts.starts,
        output_len=opts.output_len,
        target_seconds=opts.target_seconds,
        min_rounds=opts.min_rounds,
        warmup_rounds=opts.warmup_rounds,
        seed=opts.seed,
        prompts=prompts,
        extra_bench_args=tuple(opts.bench_arg),
        min_starts=opts.min_starts,
        alpha=DEFAULT_ALPHA if opts.alpha is None else opts.alpha,
        margin=DEFAULT_MARGIN if opts.margin is None else opts.margin,
        vary_prompts=opts.vary_prompts,
    )


def _verdict_options(run: Run, opts: argparse.Namespace) -> None:
    """A report of a finished run keeps the alpha and margin its looks were planned with; a run written before
    they were kept takes the ones given (or the defaults)."""
    for key in ("alpha", "margin"):
        given = getattr(opts, key)
        if given is None:
            continue
        if key in run.plan and run.plan[key] != given:
            raise DriverError(
                f"--{key} {given}: the run was planned at {key} {run.plan[key]}, which its looks spent; "
                "a report of it keeps that"
            )
        run.plan[key] = given


def _main(opts: argparse.Namespace) -> int:
    try:
        if opts.report_only:
            run = load_run(opts.report_only)
            out = opts.report_only
            _verdict_options(run, opts)
        else:
            if not opts.model:
                raise DriverError("--model is required")
            if bool(opts.dataset_path) == bool(opts.random_input_len):
                raise DriverError("give exactly one of --dataset-path (ShareGPT) and --random-input-len (random)")
            dataset = (
                Dataset("sharegpt", path=opts.dataset_path)
                if opts.dataset_path
                else Dataset("random", input_len=opts.random_input_len)
            )
            plan = plan_of(opts)
            out = opts.out or REPORTS_DIR / time.strftime("ab-%Y%m%d-%H%M%S")
            if opts.preflight is not None:
                uva_peak(opts.preflight, opts.uva_peak_gbps)  # a bad file is refused before any server starts
            driver = Driver(
                {"base": _build("base", opts), "pr": _build("pr", opts)},
                opts.model,
                out,
                plan,
                dataset,
                server_args=shlex.split(opts.server_args),
                tokenizer=opts.tokenizer,
                served_name=opts.served_name,
                startup_timeout_s=opts.startup_timeout,
                bench_timeout_s=opts.bench_timeout,
                resume=opts.resume,
                max_new_starts=opts.max_new_starts,
            )
            run = driver.run()
            if opts.preflight is not None:
                shutil.copyfile(opts.preflight, Path(out) / PREFLIGHT_COPY)
        traffic = _traffic(opts, run.model, Path(out))
        if traffic is not None and not opts.report_only:
            _keep_evidence(Path(out), opts, traffic)  # a run, not a recomputed report, keeps what it used
        rep = report_mod.write(run, out, traffic, gate_threshold=opts.gate_threshold, gate=opts.gate)
    except (DriverError, ValueError) as exc:
        print(f"moegate.ab: {exc}", file=sys.stderr)
        return 2
    print(rep.markdown)
    print(f"moegate.ab: report in {out}", file=sys.stderr)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as fh:
            # the plot is a file in the run folder, not an address a job summary can show
            fh.write(rep.markdown.replace(report_mod.PLOT_LINE, f"Plot: `{Path(out) / report_mod.PLOT}`") + "\n")
    if opts.gate and not rep.verdict.gate_passed:
        print("moegate.ab: gate FAILED: " + "; ".join(rep.verdict.gate_failures), file=sys.stderr)
        return 1
    if opts.expect_same:
        claims = [f"c={lv.concurrency}: {lv.verdict} ({lv.reason})" for lv in rep.verdict.claims()]
        if claims:
            print("moegate.ab: A/A run FAILED, one build judged against itself: " + "; ".join(claims), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
