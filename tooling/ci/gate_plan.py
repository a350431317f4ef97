"""The reusable workflow's first step: check its inputs, before anything is installed.

Standard library only: the `plan` job runs it with the runner's own python3.

    python -m tooling.ci.gate_plan plan --tiers dispatch,kernels --base 0.32.0 --pr 0.33.0 [--models random,trained] [--remote]
        [--promise identical|equivalent] [--ab-gate true|false] [--ab-gate-threshold 0.03] [--min-kernel-tests 40]
    python -m tooling.ci.gate_plan nox-arg SPEC        # --vllm=SPEC or --vllm-python=PATH for the nox sessions
    python -m tooling.ci.gate_plan local-spec SPEC [--dir WHEELS]  # on the runner: the wheel/python found there
    python -m tooling.ci.gate_plan local-arg SPEC [--dir WHEELS]   # the same, as the nox argument

A build SPEC is a release version (``0.33.0``), a wheel (``*.whl``, a path or an
http(s) URL) or the python of an existing environment (``/abs/path/bin/python``).
Bad input is one line on stderr and exit status 1; `plan` writes its outputs as
``key=value`` lines to ``$GITHUB_OUTPUT`` when that is set.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import PurePosixPath
from typing import Any

from moegate.core import tiers as vocabulary  # standard library only, as this module is

TIERS = vocabulary.CI_TIERS
GPU_TIERS = ("kernels", "e2e", "ab")
PAIR_TIERS = ("e2e", "ab")  # compare base and PR; the others gate one build
RENAMED = {"bench": "ab"}  # the A/B tier's old name here (nox -s bench is the dispatch tier's benchmark)
DEFAULT_MODELS = "random,trained"  # the e2e legs' models: the random tiny model and the committed trained one
META_BASES = ("0.32.0",)  # the meta-check demands the base fail: only the known-bad release (or an env of it)
VERSION_RE = re.compile(r"^\d+\.\d+(\.\d+)?([.+-]?[0-9A-Za-z.]+)?$")
PYPI_JSON = "https://pypi.org/pypi/{project}/json"


class PlanError(ValueError):
    """One line saying which input is wrong and what is accepted."""


def parse_tiers(text: str) -> list[str]:
    for name in (t.strip() for t in text.split(",")):
        if name in RENAMED:
            raise PlanError(
                f"tier {name!r} is now {RENAMED[name]!r} (the A/B of two builds; nox -s bench is the dispatch benchmark)"
            )
    try:
        return vocabulary.parse_tiers(text, TIERS)
    except vocabulary.UnknownInput as exc:
        raise PlanError(str(exc)) from None


def parse_models(text: str) -> list[str]:
    """The e2e and A/B legs' models: ``random``, ``trained`` or a folder's path (moegate/core/tiers.py)."""
    try:
        return vocabulary.parse_models(text or DEFAULT_MODELS)
    except vocabulary.UnknownInput as exc:
        raise PlanError(str(exc)) from None


def classify(name: str, spec: str) -> str:
    """'version', 'wheel-url', 'wheel' or 'python'; anything else is a PlanError."""
    spec = spec.strip()
    if spec.endswith(".whl"):
        return "wheel-url" if spec.startswith(("https://", "http://")) else "wheel"
    if spec.startswith("/") and PurePosixPath(spec).name.startswith("python"):
        return "python"
    if VERSION_RE.match(spec):
        return "version"
    raise PlanError(
        f"{name}={spec!r} is not a build: give a release version (0.33.0), a wheel (*.whl path or URL) "
        "or the python of an existing environment (/abs/path/bin/python)"
    )


def nox_arg(spec: str) -> str:
    """How the nox sessions take a build: an environment's python, or anything `--vllm=` installs."""
    return f"--vllm-python={spec}" if classify("build", spec) == "python" else f"--vllm={spec}"


def _fetch(url: str, method: str = "GET", timeout: float = 15) -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method, headers={"User-Agent": "moegate-plan"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # http(s) only: classify checked it
            return resp.status, resp.read() if method == "GET" else b""
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def check_remote(name: str, spec: str, fetch=_fetch) -> None:
    """A version must be a vLLM release on PyPI; a wheel URL must answer. Paths are checked where they are used."""
    kind = classify(name, spec)
    try:
        _check_remote(name, spec, kind, fetch)
    except (urllib.error.URLError, TimeoutError) as exc:
        raise PlanError(f"{name}={spec!r}: could not check it: {getattr(exc, 'reason', exc)}") from None


def _check_remote(name: str, spec: str, kind: str, fetch) -> None:
    if kind == "version":
        status, body = fetch(PYPI_JSON.format(project="vllm"))
        if status != 200:
            raise PlanError(f"{name}={spec!r}: could not list vLLM's releases on PyPI (HTTP {status})")
        releases = json.loads(body).get("releases", {})
        if spec not in releases:
            newest = sorted(releases, key=_version_key)[-3:]
            raise PlanError(f"{name}={spec!r}: vLLM {spec} is not a release on PyPI (newest: {', '.join(newest)})")
    elif kind == "wheel-url":
        status, _ = fetch(spec, "HEAD")
        if status >= 400:
            raise PlanError(f"{name}={spec!r}: the wheel URL answered HTTP {status}")


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:4])


def local_spec(name: str, spec: str, wheel_dir: str = "") -> str:
    """The build as this runner sees it: a relative wheel (a glob allowed) is found in ``wheel_dir``
    (the downloaded wheels artifact) or the working directory, and must match exactly one file;
    a wheel path or an environment's python must exist. Versions and URLs pass unchanged."""
    kind = classify(name, spec)
    if kind == "wheel":
        base = wheel_dir if wheel_dir and not os.path.isabs(spec) and os.path.isdir(wheel_dir) else ""
        matches = sorted(glob.glob(os.path.join(base, spec))) if base or glob.has_magic(spec) else [spec]
        found = [m for m in matches if os.path.isfile(m)]
        if len(found) != 1:
            where = f"in {wheel_dir}" if base else "on this runner"
            what = "no such wheel" if not found else f"{len(found)} wheels match ({', '.join(found[:3])})"
            raise PlanError(f"{name}={spec!r}: {what} {where} ({os.uname().nodename})")
        return os.path.abspath(found[0])
    if kind == "python" and not os.access(spec, os.X_OK):
        raise PlanError(f"{name}={spec!r}: no such python interpreter on this runner ({os.uname().nodename})")
    return spec


PROMISES = ("identical", "equivalent")  # what the e2e legs hold the PR to (docs/design/e2e-rules.md)


def leg_says(tier: str, promise: str = "identical", ab_gate: bool = True, ab_gate_threshold: float = 0.03,
             min_kernel_tests: int = 40) -> str:  # fmt: skip
    """What a leg runs with, as its job's name says it (``gpu LEG: SAYS``): the verdict of a vLLM repository reads the
    run's job names to know what ran (``tooling/ci/run_check.py``), so the settings that could make a leg do less are
    in them."""
    if tier == "kernels":
        return f"at least {min_kernel_tests} kernel tests"
    if tier == "e2e":
        return f"promise {promise}"
    if tier == "ab":
        return f"gating at {ab_gate_threshold:g}" if ab_gate else "advisory"
    raise PlanError(f"tier {tier!r} has no GPU leg")


def gpu_matrix(tiers: list[str], models: list[str], **settings: Any) -> list[dict[str, str]]:
    """One leg per (tier, model, build pair). Kernels gate the PR build and need no model; the A/B serves the first.
    ``settings`` (promise, ab_gate, ab_gate_threshold, min_kernel_tests) go into each leg's ``says``."""
    legs: list[dict[str, str]] = []
    for tier in tiers:
        if tier not in GPU_TIERS:
            continue
        pair = "base-vs-pr" if tier in PAIR_TIERS else "pr"
        for model in models if tier == "e2e" else [models[0] if tier == "ab" else "-"]:
            slug = re.sub(r"[^0-9A-Za-z._-]+", "_", model)
            leg = f"{tier}-{slug}-{pair}" if tier == "e2e" else f"{tier}-{pair}"
            legs.append({"tier": tier, "model": model, "pair": pair, "leg": leg, "says": leg_says(tier, **settings)})
    return legs


RUNNER_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def gpu_runner_label(label: str) -> str:
    """The ``gpu-runner-label`` input: the GPU pool's own label, added to ``self-hosted, linux, x64, gpu``."""
    if not RUNNER_LABEL.match(label):
        raise PlanError(f"gpu-runner-label={label!r} is not a runner label (letters, digits, . _ -; such as rtx4090)")
    return label


def plan(
    tiers_text: str,
    base: str,
    pr: str,
    models_text: str = DEFAULT_MODELS,
    remote: bool = False,
    **settings: Any,
) -> dict[str, str]:
    """The plan job's outputs; ``settings``: promise, ab_gate, ab_gate_threshold, min_kernel_tests (``leg_says``)."""
    tiers = parse_tiers(tiers_text)
    promise = settings.get("promise", "identical")
    if promise not in PROMISES:
        raise PlanError(f"promise={promise!r} is no promise; choose {' or '.join(PROMISES)} (docs/design/e2e-rules.md)")
    for name, spec in (("base", base), ("pr", pr)):
        classify(name, spec)
    if "meta" in tiers and classify("base", base) == "version" and base not in META_BASES:
        raise PlanError(
            f"tier 'meta' demands the base fail on host-resident cases: base must be {' or '.join(META_BASES)} "
            f"or an environment's python, not {base!r}"
        )
    models = parse_models(models_text)
    if remote:
        check_remote("base", base)
        check_remote("pr", pr)
    legs = gpu_matrix(tiers, models, **settings)
    out = {f"run-{t}": str(t in tiers).lower() for t in TIERS}
    out["run-gpu"] = str(bool(legs)).lower()
    out["gpu-matrix"] = json.dumps({"include": legs}, separators=(",", ":"))
    out["pr-arg"] = nox_arg(pr)
    out["base-arg"] = nox_arg(base)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.ci.gate_plan")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--tiers", required=True)
    p.add_argument("--base", required=True)
    p.add_argument("--pr", required=True)
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--remote", action="store_true", help="check versions on PyPI and wheel URLs")
    p.add_argument("--promise", default="identical", help="the e2e legs' promise: identical or equivalent")
    p.add_argument("--ab-gate", default="true", choices=["true", "false"], help="the A/B gates (false: advisory)")
    p.add_argument("--ab-gate-threshold", type=float, default=0.03)
    p.add_argument("--min-kernel-tests", type=int, default=40)
    p.add_argument("--gpu-runner-label", default="rtx4090", help="the GPU pool's own label")
    sub.add_parser("nox-arg").add_argument("spec")
    for cmd in ("local-spec", "local-arg"):
        c = sub.add_parser(cmd)
        c.add_argument("spec")
        c.add_argument("--name", default="build", help="the input's name, for the message (base, pr)")
        c.add_argument("--dir", default="", help="where a relative wheel is looked for (the wheels artifact)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "nox-arg":
            print(nox_arg(args.spec))
        elif args.cmd in ("local-spec", "local-arg"):
            spec = local_spec(args.name, args.spec, args.dir)
            print(nox_arg(spec) if args.cmd == "local-arg" else spec)
        else:
            gpu_runner_label(args.gpu_runner_label)
            out = plan(
                args.tiers, args.base, args.pr, args.models, args.remote, promise=args.promise,
                ab_gate=args.ab_gate == "true", ab_gate_threshold=args.ab_gate_threshold,
                min_kernel_tests=args.min_kernel_tests,
            )  # fmt: skip
            lines = [f"{k}={v}" for k, v in out.items()]
            print("\n".join(lines))
            if os.environ.get("GITHUB_OUTPUT"):
                with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as fh:
                    fh.write("\n".join(lines) + "\n")
    except PlanError as exc:
        print(f"moegate: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
