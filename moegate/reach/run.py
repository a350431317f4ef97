"""One reach run: the dispatch (and kernel) tier under coverage.py, reduced to what the report reads.

Run with the vLLM environment's Python, which must also have coverage.py (``nox -s reach`` makes such
a build: the vLLM environment's interpreter with coverage beside it). In order:

1. the layout: ``moegate.reach.layout.read`` refuses a vLLM whose fused-MoE layout the report does not
   know (one line naming the missing module; exit 2, nothing run or written);
2. the tiers: ``python -m coverage run --branch`` of ``pytest tests/dispatch [tests/kernels]`` from the
   checkout's root, under the ``ci`` profile unless ``MOEGATE_PROFILE`` says otherwise, with
   ``-p moegate.reach.plugin`` (the Triton variants compiled, the conditions that mattered). Coverage's
   ``source`` is the whole ``vllm`` folder: coverage.py reports unexecuted files only under a source
   folder, and names a module by its package (``vllm.model_executor...``) would import vLLM before
   torch is ready (a crash seen with vLLM 0.33.0 and coverage 7.16); the reduction keeps the measured
   part;
3. ``coverage json`` of the measured files, and ``moegate.reach.branches.reduce``;
4. ``OUT/reach-<tiers>-<device>-<vllm>.json``: the record ``python -m moegate.reach report`` reads
   (written whole or not at all), with the tiers, device, profile, command and pytest's exit status.

Specialisations and conditions are recorded when the kernel tier runs, and ``null`` (not measured) when
it does not: the dispatch tier stops every call at its first kernel launch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from moegate.paths import ROOT
from moegate.reach import branches
from moegate.reach.layout import Layout
from moegate.reach.plugin import ENV, SESSION

TIERS = ("dispatch", "kernels")
FORMAT = 1
"""Version of the measured record's format."""


class ReachError(RuntimeError):
    """A run that cannot be made as asked; the message is one line."""


def omitted(layout: Layout) -> list[str]:
    """Folders of the ``vllm`` folder that hold no measured file: left out of the tracing (the engine starts of the
    kernel tier's layer tests run much of vLLM's Python, which coverage.py would otherwise trace line by line)."""
    root = layout.source.root
    keep = {Path(rel).parts[0] for rel in layout.files} | {
        "/".join(Path(rel).parts[:2]) for rel in layout.files if len(Path(rel).parts) > 2
    }
    out = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"):
        if folder.name not in keep:
            out.append(f"{folder}/*")
            continue
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__"):
            if f"{folder.name}/{sub.name}" not in keep:
                out.append(f"{sub}/*")
    return out


def rcfile(layout: Layout, data_file: Path) -> str:
    """coverage.py's configuration for the run (see the module docstring for ``source``, ``omitted`` for ``omit``)."""
    return "\n".join(
        [
            "[run]",
            "branch = True",
            f"source = {layout.source.root}",
            "omit =",
            *(f"    {pattern}" for pattern in omitted(layout)),
            f"data_file = {data_file}",
            "disable_warnings = no-data-collected, module-not-imported",
            "",
        ]
    )


def label(tiers: list[str], device: str, version: str) -> str:
    """``dispatch-cpu-0.33.0``, ``dispatch+kernels-nvidia-h200-0.33.0``: a measured record's file name stem."""
    short = "cpu" if device.startswith("cpu") else re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    return f"{'+'.join(tiers)}-{short}-{version}"


def _check_tools(tiers: list[str]) -> None:
    if importlib.util.find_spec("coverage") is None:
        raise ReachError(
            f"coverage.py is not installed in {sys.executable}: `{sys.executable} -m pip install coverage`, "
            "or run `nox -s reach`, which builds an interpreter with it"
        )
    if "kernels" in tiers:
        import torch  # the vLLM environment's

        if not torch.cuda.is_available():
            raise ReachError(f"the kernel tier needs a CUDA GPU, and torch in {sys.executable} sees none")


def parse_tiers(text: str) -> list[str]:
    tiers = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in tiers if t not in TIERS]
    if unknown or not tiers:
        raise ReachError(f"--tiers {text!r}: known tiers are {', '.join(TIERS)}")
    return [t for t in TIERS if t in tiers]


STOP_GRACE_S = 90
"""After ``budget_s``, pytest is interrupted (SIGINT: it ends the session and coverage.py saves what it measured)
and given this long to stop before it is killed."""


def _run_within(cmd: list[str], cwd: Path, env: dict[str, str], budget_s: float | None) -> tuple[int, bool]:
    """(exit status, stopped by the budget) of ``cmd``; past ``budget_s`` it is interrupted, then killed."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env)
    try:
        return proc.wait(timeout=budget_s), False
    except subprocess.TimeoutExpired:
        print(f"reach: the budget of {budget_s:.0f} s is spent: interrupting the tiers", flush=True)
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=STOP_GRACE_S), True
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait(), True


def measure(
    layout: Layout,
    tiers: list[str],
    out: Path,
    pytest_args: list[str],
    checkout: Path = ROOT,
    budget_s: float | None = None,
) -> int:
    """Run the tiers under coverage and write the measured record; returns pytest's exit status.

    ``budget_s``: seconds the tiers may run; past it they are interrupted, and the record (of what ran, marked
    ``stopped_by_budget``) is still written."""
    _check_tools(tiers)
    if not all((checkout / "tests" / t).is_dir() for t in tiers):
        raise ReachError(f"runs from a moegate checkout (its tests/), and {checkout} is none: set MOEGATE_ROOT")
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / SESSION).unlink(missing_ok=True)
    rc = work / "coveragerc"
    rc.write_text(rcfile(layout, work / ".coverage"))
    env = {**os.environ, ENV: str(work), "MOEGATE_REQUIRE_VLLM": "1"}
    env.setdefault("MOEGATE_PROFILE", "ci")
    tests = [f"tests/{t}" for t in tiers]
    cmd = [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", "-m", "pytest", *tests,
           "-p", "moegate.reach.plugin", "-p", "no:cacheprovider", f"--junitxml={work / 'junit.xml'}", *pytest_args]  # fmt: skip
    print(f"reach: {shlex.join(cmd)}", flush=True)
    start = time.monotonic()
    status, stopped = _run_within(cmd, checkout, env, budget_s)
    seconds = time.monotonic() - start
    include = ",".join(str(layout.source.root / rel) for rel in layout.files)
    report = work / "coverage.json"
    subprocess.run([sys.executable, "-m", "coverage", "json", f"--rcfile={rc}", "-q", "-o", str(report),
                    f"--include={include}"], cwd=checkout, check=True)  # fmt: skip
    session = _read(work / SESSION)
    functions, triton = branches.reduce(json.loads(report.read_text()), layout)
    kernels = "kernels" in tiers
    record = {
        "format": FORMAT,
        "vllm": layout.version,
        "tiers": tiers,
        "device": session.get("device", "unknown"),
        "triton": session.get("triton"),
        "profile": env["MOEGATE_PROFILE"],
        "coverage": _coverage_version(),
        "command": shlex.join(["python", "-m", "moegate.reach", "run", "--tiers", ",".join(tiers), *pytest_args]),
        "pytest_exit": status,
        "stopped_by_budget": stopped,
        "seconds": round(seconds, 1),
        "functions": functions,
        "triton_kernels": triton,
        "specialisations": session.get("specialisations") if kernels and session.get("hooked") else None,
        "conditions": session.get("conditions", {}).get("counts") if kernels else None,
        "errors": session.get("specialisation_errors", []) + session.get("conditions", {}).get("errors", []),
    }
    dest = out / f"reach-{label(tiers, record['device'], layout.version)}.json"
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.write_text(branches.dumps(record))
    tmp.replace(dest)
    print(f"reach: {dest} ({len(functions)} functions; pytest exit {status}, {seconds:.0f} s)", flush=True)
    return status


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _coverage_version() -> str:
    import coverage  # checked present by _check_tools

    return str(coverage.__version__)
