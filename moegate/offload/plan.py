"""The offload-truth plan: every checkpoint and build it runs, side by side on one GPU, and whether each verdict is the expected one.

    moegate offload-truth --python PY [--site DIR]... --out DIR [--only NAME]... [--timeout S]
    nox -s offload-truth -- --vllm-python=PY            (the same, the PR build's Python, into reports/offload-truth)

On a CUDA GPU: builds the default tiny Qwen3-MoE (128 experts,
top-8, hidden 256, expert width 128: every width a multiple of 128, and 1-4 decode tokens in the naive
region), writes it pre-quantized in each scheme (``moegate.model.quantize``), makes the builds
(``moegate.builds.planted``: the clean one and the planted offload bugs) from ``PY`` and the ``--site``
directories, and starts one ``python -m moegate.offload.engine`` per run of ``RUNS``, all at
once (a fixed KV cache each, so no start profiles memory while another allocates). Writes
``offload-truth.json`` and ``offload-truth.md`` (``moegate.offload.report``) and each run's JSON
and log under ``DIR``.

Exit 0 when every run with an expectation met it: the clean runs PASS and each planted bug FAILS by the
rule it breaks. Runs marked ``measure`` (vLLM's Marlin experts, whose post-processing repacks the
weights) are reported without an expectation: what they show is a finding about vLLM, not about the
check. Exit 1 when an expectation is missed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moegate.builds.planted import BuildError, make_build
from moegate.model.quantize import quantize_checkpoint
from moegate.model.tiny_model import build
from moegate.model.tiny_spec import TinyMoESpec
from moegate.offload import report as offload_report
from moegate.paths import ROOT
from moegate.serve.processes import stop_tree

GIB = 1 << 30
AMPLE_GB = 64.0
DEFAULT_TIMEOUT_S = 480
LOG_TAIL = 40


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    checkpoint: str  # "bf16" or a moegate.model.quantize scheme
    moe_backend: str
    budget: str  # "ample" (every expert weight), "one-w13" (layer 0's w13 exactly), "none" (no offload)
    expect: str  # "PASS", "FAIL" or "measure"
    why: str
    bug: str | None = None  # a moegate.builds.planted bug spec
    rules: tuple[str, ...] = ()  # with FAIL: the rules the findings must include

    @property
    def build(self) -> str:
        return self.bug or "clean"


RUNS: tuple[Run, ...] = (
    Run("bf16-device", "bf16", "triton", "none", "PASS", "control: no offload, nothing marked, all device memory"),
    Run("bf16-uva", "bf16", "triton", "ample", "PASS", "the unquantized layer, every expert weight offloaded"),
    Run("bf16-one-w13", "bf16", "triton", "one-w13", "PASS", "a budget of one w13: layer 0's w13 alone on the host"),
    Run("fp8-block-uva", "fp8-block", "triton", "ample", "PASS", "Fp8MoEMethod, 128x128 blocks, Triton experts"),
    Run("w8a8-int8-uva", "w8a8-int8", "triton", "ample", "PASS", "CompressedTensorsW8A8Int8MoEMethod, Triton"),
    Run("w4a16-uva-triton", "w4a16", "triton", "ample", "PASS", "CompressedTensorsWNA16MoEMethod, TritonWNA16Experts"),
    Run("w4a16-uva-marlin", "w4a16", "marlin", "ample", "measure", "the same checkpoint on Marlin (repacks at load)"),
    Run("fp8-block-uva-marlin", "fp8-block", "marlin", "ample", "measure", "block FP8 on Marlin (repacks at load)"),
    Run("bf16-uva-noop", "bf16", "triton", "ample", "FAIL", "planted: the offloader does nothing",
        bug="uva=noop", rules=("budget",)),
    Run("bf16-uva-back", "bf16", "triton", "ample", "FAIL", "planted: post-processing copies marked weights back",
        bug="uva=back", rules=("marked-not-host", "accounting")),
    Run("fp8-block-uva-back", "fp8-block", "triton", "ample", "FAIL", "planted: the same, on the FP8 method",
        bug="uva=back", rules=("marked-not-host", "accounting")),
)  # fmt: skip


class PlanError(ValueError):
    """Bad input to the plan; one line."""


def budget_gb(run: Run, spec: TinyMoESpec) -> float:
    """``cpu_offload_gb`` for the run: one bf16 w13 is ``spec.w13_bytes`` (a power of two here: exact in GiB)."""
    return {"ample": AMPLE_GB, "none": 0.0, "one-w13": spec.w13_bytes / GIB}[run.budget]


def met(run: Run, result: dict[str, Any]) -> bool:
    """Whether the run's outcome is its expectation (a ``measure`` run meets it by completing)."""
    verdict = result.get("verdict")
    if verdict is None:
        return False
    if run.expect == "measure":
        return True
    if run.expect == "PASS":
        return verdict == "PASS"
    rules = {f["rule"] for f in result.get("findings", [])}
    return verdict == "FAIL" and set(run.rules) <= rules


def prepare_models(work: Path, schemes: set[str]) -> tuple[dict[str, Path], TinyMoESpec]:
    """The bf16 tiny model and its quantized copies under ``work/models``."""
    models = work / "models"
    bf16 = models / "bf16"
    if not bf16.is_dir():
        build(bf16)
    paths = {"bf16": bf16}
    for scheme in sorted(schemes - {"bf16"}):
        dest = models / scheme
        paths[scheme] = dest if dest.is_dir() else quantize_checkpoint(bf16, dest, scheme)
    return paths, TinyMoESpec.from_model_dir(bf16)


def prepare_builds(work: Path, python: str, sites: Sequence[str], bugs: set[str | None]) -> dict[str, Path]:
    out = {}
    for bug in sorted(bugs, key=lambda b: b or ""):
        label = bug or "clean"
        try:
            out[label] = make_build(work / "builds" / label.replace("=", "-"), python, sites=sites, bug=bug)
        except BuildError as exc:
            raise PlanError(f"cannot make the {label} build: {exc}") from None
    return out


def _tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-LOG_TAIL:])
    except OSError:
        return ""


def execute(
    runs: Sequence[Run], models: dict[str, Path], builds: dict[str, Path], spec: TinyMoESpec, out: Path, timeout: float
) -> list[dict[str, Any]]:
    """Start every run's engine at once; wait for all; each run's result (its JSON, or why there is none)."""
    (out / "runs").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}  # each build makes its own path
    started = []
    for run in runs:
        js, log = out / "runs" / f"{run.name}.json", out / "logs" / f"{run.name}.log"
        cmd = [
            str(builds[run.build]), "-m", "moegate.offload.engine", "--model", str(models[run.checkpoint]),
            "--json", str(js), "--budget-gb", repr(budget_gb(run, spec)), "--moe-backend", run.moe_backend,
        ]  # fmt: skip
        fh = log.open("w")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT)
        started.append((run, proc, fh, js, log, cmd, time.perf_counter()))
    results = []
    deadline = time.perf_counter() + timeout
    for run, proc, fh, js, log, cmd, t0 in started:
        try:
            rc: int | None = proc.wait(timeout=max(1.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            stop_tree(proc)
            rc = None
        fh.close()
        result: dict[str, Any] = {"run": dataclasses.asdict(run), "command": " ".join(cmd), "log": str(log)}
        if rc == 0 and js.is_file():
            result.update(json.loads(js.read_text()))
        else:
            result["error"] = f"timed out after {timeout:.0f} s" if rc is None else f"exit code {rc}"
            result["log_tail"] = _tail(log)
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        result["met"] = met(run, result)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moegate offload-truth", description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the interpreter whose packages the builds see")
    parser.add_argument("--site", action="append", default=[], help="a directory first on the builds' path (vLLM)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--work", type=Path, default=None, help="models and builds (default: OUT/../offload-work)")
    parser.add_argument("--only", action="append", default=[], help=f"run only these (of {[r.name for r in RUNS]})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds for all runs together")
    args = parser.parse_args(argv)

    try:
        unknown = sorted(set(args.only) - {r.name for r in RUNS})
        if unknown:
            raise PlanError(f"unknown run(s) {unknown}; known: {[r.name for r in RUNS]}")
        runs = [r for r in RUNS if not args.only or r.name in args.only]
        work = args.work or args.out.parent / "offload-work"
        t0 = time.perf_counter()
        models, spec = prepare_models(work, {r.checkpoint for r in runs})
        builds = prepare_builds(work, args.python, args.site, {r.bug for r in runs})
        prepared_s = time.perf_counter() - t0
    except (PlanError, ValueError, FileExistsError) as exc:
        print(f"moegate.offload.plan: {exc}", file=sys.stderr)
        return 2
    results = execute(runs, models, builds, spec, args.out, args.timeout)
    command = "python -m moegate offload-truth " + " ".join(argv if argv is not None else sys.argv[1:])
    doc = {
        "command": command,
        "prepare_s": round(prepared_s, 1),
        "wall_s": round(time.perf_counter() - t0, 1),
        "spec": dataclasses.asdict(spec),
        "results": results,
    }
    (args.out / "offload-truth.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    page = offload_report.render(doc)
    (args.out / "offload-truth.md").write_text(page)
    print(page)
    return 0 if all(r["met"] for r in results) else 1
