"""One GPU leg, from one place: the reusable workflow's ``gpu`` job runs it, and so does the H200 rehearsal
(``lab/gpu/rehearsal.sh``), so the two cannot drift apart.

    python -m tooling.ci.gpu_leg preflight --start                     # first: driver and disk, any Python, no torch
    python -m tooling.ci.gpu_leg preflight --builds FILE --tier T[,T] [--model NAME[,NAME]]   # the GPU, through torch
    python -m tooling.ci.gpu_leg kernels --builds FILE [--min-kernel-tests N] [--sweep-cases N]
    python -m tooling.ci.gpu_leg e2e --builds FILE --model NAME [--promise identical|equivalent]
    python -m tooling.ci.gpu_leg ab --builds FILE --model NAME --preflight FILE [--advisory | --gate-threshold T]
        [--reports DIR] [--dry-run] [-- MORE OPTIONS FOR THE TIER'S COMMAND]

``--builds`` is the JSON ``nox -s builds`` writes in the ``gpu`` job (the rehearsal writes its own, for builds made
with ``moegate.builds.planted``): ``pr``/``base`` (the builds' Pythons), ``pr_label``/``base_label``, ``driver`` (the e2e
driver's Python, the A/B's), ``eval`` (lm-eval's), ``models`` (name -> folder). Each leg prints the command it runs,
runs it from the checkout, and ends with ``gpu leg NAME: exit N in S s`` (the rehearsal's per-leg times). Everything a
leg passes is here, and only here:

- **preflight** (``moegate preflight``): first with ``--start``, before the environments are built, the driver and
  ``START_DISK_GIB`` free for them; then in the PR build, torch's view of the GPU, the measured UVA read bandwidth
  (its JSON goes to the A/B) and the pinned host memory the leg's tiers will load (``--model`` for the models the leg
  serves, ``KERNEL_PINNED_GIB`` for a kernels leg), with ``RUN_DISK_GIB`` left for the runs.
- **kernels** (``moegate gate --tiers dispatch,kernels[,sweep][,diff]``): the PR build; at least
  ``--min-kernel-tests`` kernel tests executed; where the builds file names a base, the differential tier against it
  (``--base-python``), judged by ``--promise``; its page ``REPORTS/gate.md`` (first line
  ``# moegate gate: kernels leg: VERDICT``).
- **e2e** (``moegate e2e run``): both gates on one model, the GPU flags of ``tooling/serving.py`` (experts
  UVA-offloaded), GSM8K's 250 questions once a build (``E2E_OPTIONS``: the configuration the H200 measured at
  408-455 s a pair, ``results/e2e-h200-scored.md``), judged by the promise the PR makes (``--promise``, the
  workflow's ``promise`` input: ``identical`` by default, ``equivalent``; docs/design/e2e-rules.md). GSM8K is checked
  (sha256) before any server starts.
- **ab** (``moegate ab``): the decode time a token at ``AB_OPTIONS``, CUDA graphs on, the preflight's bandwidth in
  the evidence columns; gating at ``--gate-threshold`` (engineer ab's rule: FAIL, regressed by at least the threshold,
  or a run not over fail; unresolved passes), or advisory (no ``--gate``: the verdict is reported, never fails).

**Runner faults.** The e2e and A/B legs run watched (``moegate.preflight.attempts``): a failure is judged by
``moegate.core.faults``, and a runner fault (out of memory while NVML shows another process on the GPU, a driver
error, a lost runner) is retried once, after waiting for the other processes to leave; a second fault exits 3. The
kernels leg is ``moegate gate``, which does the same for its tiers and exits 3 itself; the preflight is not retried
(it judges the runner: free GPU memory against each leg's need, ``--leg``).

Standard library only (the runner's Python, the GPU machine's ``python3``), run from the checkout root.
Exit status: the leg's command's; 2 for bad input or data (one line): an unreadable builds file, a model it does not
name, GSM8K missing or not the published file; 3 a runner fault, twice.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from moegate.core.faults import RUNNER_FAULT, Attempt, Outcome, classify
from moegate.e2e.gsm8k_files import GSM8K_SHA256, DataError, gsm8k_dir, gsm8k_file
from moegate.preflight.attempts import retry_once, run_watched
from moegate.preflight.gpu_processes import gpu_processes, unlisted_mib
from tooling.serving import server_args

ROOT = Path(__file__).resolve().parent.parent.parent
START_DISK_GIB = 30.0
"""Before the builds: two vLLM environments of about 9.4 GB each, the driver's and lm-eval's, the models and runs."""
RUN_DISK_GIB = 10.0
"""After the builds: what the runs still write (models, Triton's and vLLM's caches, the servers' logs, reports)."""
KERNEL_PINNED_GIB = 5.0
"""A kernels leg's pinned weights: a sweep worker pinned 4.4-4.9 GiB at 5,000 cases (results/kernels-0.33.0.md)."""
E2E_OPTIONS = ("--gates=greedy,gsm8k", "--gsm8k-limit=250", "--gsm8k-cap=250", "--no-gsm8k-repeat")
"""Both gates, GSM8K's first 250 test questions once a build: what bounds an e2e leg to about 7.5 minutes."""
AB_LEVELS = "1,4,16"
AB_OPTIONS = (
    f"--concurrency={AB_LEVELS}", "--starts=3", "--min-starts=3", "--target-seconds=5", "--warmup-rounds=1",
    "--min-rounds=3", "--output-len=128", "--random-input-len=128",
)  # fmt: skip
"""One look at 3 starts a build (6 server starts), three levels: single-request decode, a small batch, a full one.
What fits the 20-minute verdict beside the other legs (a start of the tiny model with graphs on: about 1.5 minutes);
3 starts a build resolve a 5 % change where the start-to-start spread is under 0.77 % (docs/design/ab.md); a smaller change,
or a noisier runner, reads *unresolved*, which passes. On the H200 the random tiny model's spread with graphs was
9.6-16.4 % (results/ab-decode-spread.md): there this leg catches only gross regressions."""
DEFAULT_GATE_THRESHOLD = 0.03


class LegError(ValueError):
    """Bad input or data: one line, exit 2."""


def read_builds(path: Path) -> dict[str, object]:
    try:
        builds = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise LegError(f"--builds {path}: not a readable JSON file ({exc})") from None
    if not isinstance(builds, dict) or "pr" not in builds:
        raise LegError(f"--builds {path}: names no PR build ('pr')")
    return builds


def _need(builds: dict[str, object], key: str, leg: str) -> str:
    value = builds.get(key)
    if not isinstance(value, str) or not value:
        raise LegError(f"the {leg} leg needs '{key}' in the builds file, and it has none")
    return value


def model_dir(builds: dict[str, object], name: str) -> str:
    models = builds.get("models")
    if not isinstance(models, dict) or name not in models:
        known = ", ".join(models) if isinstance(models, dict) else "none"
        raise LegError(f"--model {name}: the builds file names no such model (it has: {known})")
    return str(models[name])


def check_gsm8k(directory: str | None) -> Path:
    """Both GSM8K files, sha256-checked, before any server starts; ``LegError`` (one line) otherwise."""
    try:
        for name in GSM8K_SHA256:
            gsm8k_file(name, directory)
    except DataError as exc:
        raise LegError(f"GSM8K: {exc}") from None
    return gsm8k_dir(directory)


def preflight_command(opts: argparse.Namespace, builds: dict[str, object] | None) -> list[str]:
    if builds is None:  # --start: the runner's Python, before any environment exists
        return [
            sys.executable,
            "-m",
            "moegate",
            "preflight",
            "--checks=driver,disk",
            f"--need-disk-gib={START_DISK_GIB:g}",
        ]
    tiers = [t for t in opts.tier.split(",") if t]
    models = [model_dir(builds, m) for m in opts.model.split(",") if m] if opts.model else []
    cmd = [_need(builds, "pr", "preflight"), "-m", "moegate", "preflight", "--checks=gpu,disk"]
    cmd += [f"--need-disk-gib={RUN_DISK_GIB:g}", f"--json={opts.reports / 'preflight.json'}"]
    cmd += [f"--model={m}" for m in models]
    if "kernels" in tiers:
        cmd.append(f"--need-pinned-gib={KERNEL_PINNED_GIB:g}")
    elif not models:
        raise LegError(f"preflight --tier {opts.tier}: name the models the leg serves (--model)")
    # free GPU memory for the legs side by side (moegate/preflight/needs.py): each e2e leg serves one model
    legs = ["kernels"] * ("kernels" in tiers) + ["e2e"] * len(models) * ("e2e" in tiers) + ["ab"] * ("ab" in tiers)
    return cmd + [f"--leg={leg}" for leg in legs]


def kernels_command(opts: argparse.Namespace, builds: dict[str, object]) -> list[str]:
    pr = _need(builds, "pr", "kernels")
    base = builds.get("base")
    tiers = "dispatch,kernels" + (",sweep" if opts.sweep_cases else "") + (",diff" if base else "")
    cmd = [
        pr,
        "-m",
        "moegate",
        "gate",
        f"--vllm-python={pr}",
        f"--tiers={tiers}",
        f"--label={builds.get('pr_label', 'pr')}",
    ]
    cmd += [f"--junit={opts.reports / 'gate.xml'}", f"--page={opts.reports / 'gate.md'}"]
    cmd += [f"--min-kernel-tests={opts.min_kernel_tests}"]
    if opts.sweep_cases:
        cmd += [f"--sweep-cases={opts.sweep_cases}", f"--sweep-json={opts.reports / 'kernel-sweep.json'}"]
    if base:
        cmd += [
            f"--base-python={base}",
            f"--promise={opts.promise}",
            f"--diff-json={opts.reports / 'kernel-diff.json'}",
        ]
    return cmd


def e2e_command(opts: argparse.Namespace, builds: dict[str, object]) -> list[str]:
    model = model_dir(builds, opts.model)
    data = check_gsm8k(opts.gsm8k_dir)
    cmd = [_need(builds, "driver", "e2e"), "-m", "moegate", "e2e", "run"]
    for role in ("base", "pr"):
        cmd += [f"--{role}={_need(builds, role, 'e2e')}", f"--{role}-label={builds.get(f'{role}_label', role)}"]
    cmd += [
        f"--model={model}",
        # eager: two starts of one build compute alike only so, which `identical` needs (docs/design/e2e-rules.md,
        # "Two starts of one build"); the A/B, which judges speed, serves with graphs
        f"--server-args={server_args(gpu=True)}",
        f"--eval-python={_need(builds, 'eval', 'e2e')}",
    ]
    cmd += [f"--gsm8k-dir={data}", *E2E_OPTIONS, f"--promise={opts.promise}"]
    cmd += [f"--out={opts.reports / f'e2e-{opts.model}-run'}", f"--report={opts.reports / f'e2e-{opts.model}.md'}"]
    return cmd


def ab_command(opts: argparse.Namespace, builds: dict[str, object]) -> list[str]:
    model = model_dir(builds, opts.model)
    if opts.preflight is None or not opts.preflight.is_file():
        raise LegError(f"--preflight {opts.preflight}: no such file (the leg's preflight writes it first)")
    cmd = [_need(builds, "driver", "ab"), "-m", "moegate", "ab"]
    for role in ("base", "pr"):
        cmd += [f"--{role}-python={_need(builds, role, 'ab')}", f"--{role}-label={builds.get(f'{role}_label', role)}"]
    cmd += [f"--model={model}", f"--server-args={server_args(AB_LEVELS, graphs=True, gpu=True)}", *AB_OPTIONS]
    cmd += [f"--out={opts.reports / 'ab'}", f"--preflight={opts.preflight}"]
    if not opts.advisory:
        cmd += ["--gate", f"--gate-threshold={opts.gate_threshold:g}"]
    return cmd


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tooling.ci.gpu_leg", description=(__doc__ or "").splitlines()[0])
    p.add_argument("leg", choices=("preflight", "kernels", "e2e", "ab"))
    p.add_argument("--builds", type=Path, help="the builds JSON (nox -s builds, or the rehearsal's)")
    p.add_argument("--reports", type=Path, default=ROOT / "reports", help="where the leg writes (default reports/)")
    p.add_argument("--start", action="store_true", help="preflight: the driver and disk, before the builds")
    p.add_argument("--tier", default="", help="preflight: the tiers the legs run (kernels, e2e, ab; comma list)")
    p.add_argument("--model", default="", help="e2e, ab: the model's name in the builds file; preflight: a comma list")
    p.add_argument("--min-kernel-tests", type=int, default=1)
    p.add_argument("--sweep-cases", type=int, default=0, help="kernels: also sweep this many cases (0: no sweep)")
    p.add_argument("--gsm8k-dir", default=None, help="e2e: GSM8K's folder (default: $MOEGATE_GSM8K_DIR)")
    p.add_argument("--promise", default="identical", help="e2e, kernels: what the PR promises, identical or equivalent")
    p.add_argument("--preflight", type=Path, help="ab: the preflight JSON (its measured UVA read bandwidth)")
    gate = p.add_mutually_exclusive_group()
    gate.add_argument(
        "--gate-threshold", type=float, default=DEFAULT_GATE_THRESHOLD, help="ab: the decode slow-down that fails"
    )
    gate.add_argument("--advisory", action="store_true", help="ab: report the verdict, never fail on it")
    p.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    return p


def command(opts: argparse.Namespace) -> list[str]:
    if opts.leg == "preflight" and opts.start:
        return preflight_command(opts, None)
    if opts.builds is None:
        raise LegError(f"the {opts.leg} leg needs --builds FILE")
    builds = read_builds(opts.builds)
    if opts.leg in ("e2e", "ab") and not opts.model:
        raise LegError(f"the {opts.leg} leg needs --model NAME (one of the builds file's models)")
    make = {"preflight": preflight_command, "kernels": kernels_command, "e2e": e2e_command, "ab": ab_command}
    return make[opts.leg](opts, builds)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    more: list[str] = []
    if "--" in args:
        more = args[args.index("--") + 1 :]
        args = args[: args.index("--")]
    opts = parser().parse_args(args)
    name = opts.leg + (f" {opts.model}" if opts.leg in ("e2e", "ab") and opts.model else "")
    try:
        cmd = [*command(opts), *more]
    except LegError as exc:
        print(f"gpu leg {name}: {exc}", file=sys.stderr)
        return 2
    print(f"gpu leg {name}: $ {shlex.join(cmd)}", flush=True)
    if opts.dry_run:
        return 0
    opts.reports.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if opts.leg not in RETRIED:  # preflight judges the runner itself; kernels is `moegate gate`, which retries
        status = subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    else:
        status = run_retried(name, cmd, env)
    print(f"gpu leg {name}: exit {status} in {time.monotonic() - start:.0f} s", flush=True)
    return status


RETRIED = ("e2e", "ab")
"""The legs whose failures this runner judges (moegate.core.faults) and retries once on a runner fault."""
READ_GPU = gpu_processes
"""The NVML question the runner-fault verdict asks (moegate.preflight.gpu_processes); the tests hand in a stand-in."""
READ_UNLISTED = unlisted_mib
"""The GPU's memory no listed process holds, asked before each attempt (a container's NVML may list no other)."""
WAIT_S = 120.0
"""Before the retry of a runner fault, at most this long for the other processes to leave the GPU."""


def run_retried(name: str, cmd: list[str], env: dict[str, str]) -> int:
    """The leg's command, watched (moegate.preflight.attempts); on a runner fault (another process's memory on the
    GPU, a driver error, a lost runner) once more. Exit: the command's own on a pass or a FAIL (1, or 2 for bad
    input or a server that did not start for the build's own reasons), 3 on a runner fault twice."""
    statuses: list[int] = []

    def attempt(number: int) -> Outcome:
        ran = run_watched(cmd, cwd=ROOT, env=env, reader=READ_GPU, unlisted=READ_UNLISTED)
        statuses.append(ran.status)
        return classify(Attempt(ran.status, (), ran.output, ran.others))

    say = lambda line: print(f"gpu leg {name}: {line}", flush=True)
    outcomes = retry_once(attempt, say, reader=READ_GPU, unlisted=READ_UNLISTED, wait_s=WAIT_S)
    last = outcomes[-1]
    print(f"gpu leg {name}: {last}", flush=True)
    return last.exit_status if last.verdict == RUNNER_FAULT else statuses[-1]


if __name__ == "__main__":
    raise SystemExit(main())
