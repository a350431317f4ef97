"""``moegate gate``: gate one vLLM build, the one you have.

    moegate gate --vllm-python PATH   a Python (or its venv folder) where your vLLM is installed: a venv, or a source
                                      checkout installed editable into one (pip install -e .); nothing is installed
    moegate gate --wheel FILE         a vLLM wheel: nox builds an environment for it once (tooling/nox_builds.py)
    moegate gate --vllm VERSION       a vLLM release: the same, from the package registry
        [--tiers dispatch,kernels,sweep,diff] [--base-python PATH [--promise identical|equivalent] [--diff-cases N]]
        [--junit FILE] [--min-kernel-tests N] [--sweep-cases N] [-- PYTEST_ARGS]

Runs from a moegate checkout (the tests live there). The build is asked first, in a process of its own, whether vLLM
imports (``moegate.builds.probe``): where it does not, the gate FAILS with one line naming the build and the import's
error, before any tier; a skip would let a broken pull request through. Then the tiers, in one pytest run against
the build (``MOEGATE_REQUIRE_VLLM=1``):

- ``dispatch`` (``tests/dispatch``): the path at both entrypoints is the spec's; the dispatch-table golden;
- ``kernels`` (``tests/kernels``): outputs against the torch reference, on a CUDA GPU; at least
  ``--min-kernel-tests`` of them must have executed (read from the JUnit report), so a tier that skipped everything
  is red;
- ``sweep``: ``moegate sweep`` over ``--sweep-cases`` generated cases in worker processes;
- ``diff``: ``moegate diff``, the differential kernel tier: the base build (``--base-python``) against this one on
  ``--diff-cases`` generated cases, judged by the promise the PR makes (``--promise``; ``moegate.kernels.
  diff_tier``). A tier it could not judge (builds it cannot compare) exits 2 there and is a FAIL here.

The default is ``dispatch``, plus ``kernels`` where the build's torch sees a CUDA GPU (and ``diff`` where a base is
given); asking for ``kernels``, ``sweep`` or ``diff`` where it sees none is one line and exit 2, and so is ``diff``
without a base, or with a base whose vLLM does not import or whose torch sees no CUDA GPU. ``--wheel`` and ``--vllm`` hand the same options to
``nox -s gate -- --vllm=SPEC``, which builds (or reuses) the environment and runs this command in it with
``--vllm-python``: one way to build environments, the nox sessions'.

Each tier runs watched (``moegate.preflight.attempts``): its output passed through and kept, the GPU's other
processes sampled while it runs. A tier that fails is judged by ``moegate.core.faults``: the build's failure
(**FAIL**: a test's assertion, a planted bug, a kernel that faults, an out-of-memory error on a GPU the build had to
itself) or the runner's (**RUNNER FAULT**: out of memory while NVML shows other processes holding the GPU's memory, a
driver error, a lost runner), which is retried once, after waiting at most ``--fault-wait-s`` for the others to
leave; a second fault is the verdict again, never a pass.

The page: ``--page`` (default ``reports/gate.md``), written whole or not at all, also on a pass
(``moegate.cli.gate_page``): its first line ``# moegate gate: <dispatch|kernels> leg: <PASS|FAIL|RUNNER FAULT>``, then
what ran, each runner fault with its retry, and each failing case with what the spec required, what ran, the numbers
and the ``moegate repro`` command that reproduces it.

Exit status: 0 every tier passed; 1 the gate failed (a tier, the kernel floor, a vLLM that does not import);
2 bad input (one line, no page): no such interpreter, a wheel that is not vLLM, an unknown tier, no GPU for a GPU
tier, a diff tier without a base it can run; 3 a runner fault, twice. A diff tier that is not
judged (exit 2 from ``moegate diff``: builds it cannot compare) is a FAIL, never a pass.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path

from moegate.builds.probe import TEST_PACKAGES, probe
from moegate.builds.wheels import NotAVllmWheel, vllm_wheel
from moegate.cli.gate_page import Gate, TierRun, render
from moegate.cli.gate_page import write as write_page
from moegate.core.check import dev_run
from moegate.core.faults import EXIT_STATUS, FAIL, PASS, RUNNER_FAULT, Attempt, Failure, Outcome, classify
from moegate.core.junit import Failed, count, failed
from moegate.core.tiers import GATE_TIERS, UnknownInput
from moegate.core.tiers import parse_tiers as parse_tier_list
from moegate.paths import REPORTS_DIR, ROOT, is_checkout
from moegate.preflight.attempts import DEFAULT_WAIT_S, retry_once, run_watched
from moegate.preflight.gpu_processes import gpu_processes, unlisted_mib

TIERS = GATE_TIERS
GPU_TIERS = ("kernels", "sweep", "diff")
KERNEL_PREFIX = "tests.kernels"
RELEASE_RE = re.compile(r"^\d+\.\d+\.\d+([.+-][0-9A-Za-z.]+)?$")


class GateInputError(ValueError):
    """Bad input: one line, exit 2."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="moegate gate",
        description="gate one vLLM build: dispatch, kernels, sweep",
        epilog="arguments after -- go to pytest",
    )
    build = p.add_mutually_exclusive_group(required=True)
    build.add_argument("--vllm-python", metavar="PATH", help="the Python (or venv folder) of your vLLM; used as it is")
    build.add_argument("--wheel", metavar="FILE", help="a vLLM wheel: an environment is built for it (nox, once)")
    build.add_argument("--vllm", metavar="VERSION", help="a vLLM release: its environment is built (nox, once)")
    p.add_argument("--tiers", help="comma list of dispatch, kernels, sweep (default: dispatch, and kernels on a GPU)")
    p.add_argument("--label", help="the build's name in the verdict (default: its vLLM version)")
    p.add_argument("--junit", type=Path, default=REPORTS_DIR / "gate.xml", help="the pytest run's JUnit report")
    p.add_argument("--min-kernel-tests", type=int, default=1, help="kernel tests that must have executed (default 1)")
    p.add_argument("--sweep-cases", type=int, default=5000, help="cases of the sweep tier (default 5000)")
    p.add_argument("--sweep-json", type=Path, default=REPORTS_DIR / "kernel-sweep.json")
    p.add_argument(
        "--page", type=Path, default=REPORTS_DIR / "gate.md", help="the verdict's page (default reports/gate.md)"
    )
    p.add_argument(
        "--fault-wait-s", type=float, default=DEFAULT_WAIT_S,
        help=f"before the retry of a runner fault, wait at most this long for other processes to leave the GPU (default {DEFAULT_WAIT_S:g})",
    )  # fmt: skip
    p.add_argument("--base-python", metavar="PATH", help="the base build (a Python or venv folder): the diff tier")
    p.add_argument(
        "--promise", choices=("identical", "equivalent"), default="identical", help="diff: what the PR promises"
    )
    p.add_argument("--diff-cases", type=int, default=300, help="cases of the diff tier (default 300)")
    p.add_argument("--diff-json", type=Path, default=REPORTS_DIR / "kernel-diff.json")
    return p


def split_pytest_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(this command's arguments, pytest's): the first ``--`` separates them."""
    args = list(argv)
    if "--" in args:
        i = args.index("--")
        return args[:i], args[i + 1 :]
    return args, []


def parse_tiers(text: str | None, cuda: bool, base: bool = False) -> list[str]:
    """The tiers asked for (or the default for a machine whose torch sees a CUDA GPU or not, with a base or not)."""
    if text is None:
        return (["dispatch", "kernels"] + (["diff"] if base else [])) if cuda else ["dispatch"]
    try:
        names = parse_tier_list(text, TIERS, where="--tiers")
    except UnknownInput as exc:  # the one vocabulary every door refuses alike (moegate/core/tiers.py)
        raise GateInputError(str(exc)) from None
    return [t for t in TIERS if t in names]


def interpreter(path: str, flag: str = "--vllm-python") -> str:
    """``--vllm-python`` (or ``flag``): a Python, or a venv folder (its ``bin/python``), that runs."""
    given = Path(path).expanduser()
    py = given / "bin" / "python" if given.is_dir() else given
    if not (py.is_file() and os.access(py, os.X_OK)):
        raise GateInputError(f"{flag} {path}: no such interpreter")
    return str(py.absolute())


def base_build(path: str | None, tiers: list[str]) -> str | None:
    """The base build the diff tier compares with, asked up front as the PR's is; ``GateInputError`` (one line)."""
    if "diff" not in tiers:
        return None
    if path is None:
        raise GateInputError("tier diff compares this build with the PR's base: give the base as --base-python PATH")
    base = interpreter(path, "--base-python")
    found = probe(base, ROOT)
    if not found.imports:
        raise GateInputError(f"--base-python {base}: vLLM does not import there ({found.error}): diff cannot run it")
    if not found.cuda:
        raise GateInputError(f"tier diff needs a CUDA GPU, and torch in the base build {base} sees none")
    return base


def nox_command(opts: argparse.Namespace, argv: Sequence[str]) -> list[str]:
    """``nox -s gate -- --vllm=SPEC <this command's other options> [-- pytest args]`` for ``--wheel``/``--vllm``."""
    spec = opts.wheel or opts.vllm
    if opts.wheel:
        vllm_wheel(opts.wheel)  # NotAVllmWheel: refused before an environment is built for it
        spec = str(Path(opts.wheel).expanduser().absolute())
    elif not RELEASE_RE.match(opts.vllm):
        raise GateInputError(f"--vllm {opts.vllm!r}: not a release version (e.g. 0.33.0)")
    nox = shutil.which("nox", path=str(Path(sys.executable).parent)) or shutil.which("nox")
    if nox is None:
        raise GateInputError(
            "--wheel and --vllm build an environment with nox: pip install nox uv (or give --vllm-python)"
        )
    own, extra = split_pytest_args(argv)
    rest, skip = [], False
    for arg in own:  # everything but the build
        if skip:
            skip = False
        elif arg in ("--wheel", "--vllm"):
            skip = True
        elif not arg.startswith(("--wheel=", "--vllm=")):
            rest.append(arg)
    return [
        nox,
        "-f",
        str(ROOT / "noxfile.py"),
        "-s",
        "gate",
        "--",
        f"--vllm={spec}",
        *rest,
        *(["--", *extra] if extra else []),
    ]


def _say(line: str) -> None:
    print(f"moegate gate: {line}", flush=True)


READ_GPU = gpu_processes
"""The NVML question the runner-fault verdict asks (``moegate.preflight.gpu_processes``); the tests hand in a stand-in."""
READ_UNLISTED = unlisted_mib
"""The GPU's memory no listed process holds, asked before each attempt (a container's NVML may list no other)."""


def failed_or_none(junit: Path) -> list[Failed]:
    """The report's failing tests; none where there is no readable report (the run died first: its output tells)."""
    try:
        return failed(junit)
    except (OSError, ET.ParseError):
        return []


def _tier_attempt(cmd: list[str], env: dict[str, str], junit: Path | None) -> Callable[[int], Outcome]:
    """One run of ``cmd``, its verdict from the JUnit report's failing tests (where it writes one) and its output."""

    def attempt(number: int) -> Outcome:
        if junit is not None:
            junit.unlink(missing_ok=True)  # a report left by the attempt before is not this one's
        ran = run_watched(cmd, cwd=ROOT, env=env, reader=READ_GPU, unlisted=READ_UNLISTED)
        named = failed_or_none(junit) if junit is not None and ran.status != 0 else []
        failures = tuple(Failure(f.nodeid, f.text or f.message) for f in named)
        return classify(Attempt(ran.status, failures, ran.output, ran.others))

    return attempt


def _run_tier(name: str, cmd: list[str], env: dict[str, str], junit: Path | None, wait_s: float) -> TierRun:
    outcomes = retry_once(
        _tier_attempt(cmd, env, junit),
        lambda line: _say(f"{name}: {line}"),
        reader=READ_GPU,
        unlisted=READ_UNLISTED,
        wait_s=wait_s,
    )
    return TierRun(name, outcomes, cmd)


def _verdict(runs: list[TierRun]) -> str:
    verdicts = {r.verdict for r in runs}
    return FAIL if FAIL in verdicts else RUNNER_FAULT if RUNNER_FAULT in verdicts else PASS


def _write_page(opts: argparse.Namespace, gate: Gate) -> None:
    write_page(opts.page, render(gate, dev_run()))
    _say(f"page: {opts.page}")


def run_gate(opts: argparse.Namespace, pytest_args: list[str]) -> int:
    python = interpreter(opts.vllm_python)
    if not (ROOT / "tests" / "dispatch").is_dir():
        raise GateInputError(
            f"runs from a moegate checkout (its tests/), and {ROOT} is none: cd there or set MOEGATE_ROOT"
        )
    if opts.tiers is not None:
        parse_tiers(opts.tiers, cuda=True)  # an unknown tier is refused before vLLM is imported
    found = probe(python, ROOT)
    label = opts.label or python
    if not found.imports:
        line = f"build {label} ({python}): vLLM does not import: {found.error}"
        print(f"moegate gate: FAIL: {line}", file=sys.stderr)
        asked = parse_tiers(opts.tiers, cuda=False)  # None: the CPU default, dispatch
        leg = "kernels" if any(t in GPU_TIERS for t in asked) else "dispatch"
        _write_page(opts, Gate(leg, FAIL, label, python, asked, note=f"**FAIL**: {line}. No tier ran."))
        return 1
    if found.missing:
        raise GateInputError(
            f"build {python} lacks {', '.join(found.missing)}, which the tiers need: "
            f"{python} -m pip install {' '.join(TEST_PACKAGES)}"
        )
    label = opts.label or f"vLLM {found.version}"
    tiers = parse_tiers(opts.tiers, bool(found.cuda), opts.base_python is not None)
    gpu = [t for t in tiers if t in GPU_TIERS]
    if gpu and not found.cuda:
        raise GateInputError(f"tier {gpu[0]} needs a CUDA GPU, and torch in {python} sees none")
    base = base_build(opts.base_python, tiers)
    _say(
        f"build {label} ({python}{'' if label.endswith(str(found.version)) else f', vLLM {found.version}'}); tiers {', '.join(tiers)}"
    )
    if opts.tiers is None and not found.cuda:
        _say("kernels: not run, torch in this build sees no CUDA GPU (on a GPU machine they run by default)")
    runs: list[TierRun] = []
    tests = [f"tests/{t}" for t in ("dispatch", "kernels") if t in tiers]
    if tests:
        opts.junit.parent.mkdir(parents=True, exist_ok=True)
        cmd = [python, "-m", "pytest", *tests, f"--junitxml={opts.junit}", *pytest_args]
        env = {**os.environ, "MOEGATE_REQUIRE_VLLM": "1"}
        runs.append(
            _run_tier(
                " + ".join(t for t in ("dispatch", "kernels") if t in tiers), cmd, env, opts.junit, opts.fault_wait_s
            )
        )
    if "kernels" in tiers:
        if runs[-1].verdict == RUNNER_FAULT:
            why = "not judged: the tier's run was a runner fault, so its count says nothing of the build"
            runs.append(TierRun("kernel floor", [Outcome(RUNNER_FAULT, why)]))
        else:
            name, good, why = kernel_floor(opts.junit, opts.min_kernel_tests)
            runs.append(TierRun(name, [Outcome(PASS if good else FAIL, why)]))
    if "sweep" in tiers:
        opts.sweep_json.parent.mkdir(parents=True, exist_ok=True)
        cmd = [python, "-m", "moegate.kernels.sweep", f"--cases={opts.sweep_cases}", "--workers=auto", "--seed=0"]
        runs.append(_run_tier("sweep", [*cmd, f"--json={opts.sweep_json}"], dict(os.environ), None, opts.fault_wait_s))
    if base is not None:
        opts.diff_json.parent.mkdir(parents=True, exist_ok=True)
        cmd = [python, "-m", "moegate", "diff", f"--base-python={base}", f"--pr-python={python}"]
        cmd += [f"--promise={opts.promise}", f"--cases={opts.diff_cases}", "--seed=0", f"--json={opts.diff_json}"]
        runs.append(_run_tier("diff", cmd, dict(os.environ), None, opts.fault_wait_s))
    verdict = _verdict(runs)
    parts = "; ".join(f"{r.name} {'ok' if r.verdict == PASS else r.verdict} ({_why(r)})" for r in runs)
    _say(f"{verdict}: {label}: {parts}")
    leg = "kernels" if gpu else "dispatch"
    failing = failed_or_none(opts.junit) if tests and runs[0].verdict != PASS else []
    _write_page(opts, Gate(leg, verdict, label, python, tiers, runs, failing, opts.junit))
    return EXIT_STATUS[verdict]


def _why(run: TierRun) -> str:
    last = run.outcomes[-1]
    ran = "pytest exit 0" if "pytest" in run.command else "exit 0"  # the diff tier is moegate diff, no pytest
    why = ran if last.verdict == PASS and run.command else last.cause
    return why if len(run.outcomes) == 1 else f"{why}; retried after a runner fault: {run.outcomes[0].cause}"


def kernel_floor(junit: Path, minimum: int) -> tuple[str, bool, str]:
    """At least ``minimum`` kernel tests executed, by the JUnit report: (name, ok, one-line reason)."""
    try:
        c = count(junit, KERNEL_PREFIX)
    except (OSError, ET.ParseError) as exc:
        return "kernel floor", False, f"no readable JUnit report {junit}: {exc}"
    why = f"{c.executed} kernel tests executed, at least {minimum} required: {c.detail()}"
    if c.executed < minimum and c.first_skip:
        why += f"; first skip: {c.first_skip}"
    return "kernel floor", c.executed >= minimum, why


def main(argv: Sequence[str] | None = None) -> int:
    own, pytest_args = split_pytest_args(sys.argv[1:] if argv is None else argv)
    opts = parser().parse_args(own)
    if opts.min_kernel_tests < 0 or opts.sweep_cases < 1 or opts.diff_cases < 1 or opts.fault_wait_s < 0:
        print(
            "moegate gate: --min-kernel-tests and --fault-wait-s must be >= 0, --sweep-cases and --diff-cases >= 1",
            file=sys.stderr,
        )
        return 2
    try:
        if opts.vllm_python is None:
            if not is_checkout(ROOT):
                raise GateInputError(f"--wheel and --vllm build with the checkout's noxfile, and {ROOT} is no checkout")
            cmd = nox_command(opts, sys.argv[1:] if argv is None else argv)
            return subprocess.run(cmd, cwd=ROOT, check=False).returncode
        return run_gate(opts, pytest_args)
    except (GateInputError, NotAVllmWheel) as exc:
        print(f"moegate gate: {exc}", file=sys.stderr)
        return 2
