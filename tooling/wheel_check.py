"""The wheel installs and every command line runs from it: `nox -s wheel-check`.

Builds moegate's wheel from the checkout, installs it with the unit extra into a fresh
virtual environment in a temporary folder, and runs every command line from there,
outside the checkout (so nothing is imported from it): each one's ``--help``, then one
real command each. Commands that need vLLM, a GPU or a server get the real command a
user without them meets: the documented one-line refusal and its exit status. The
data paths are the checkout's through ``MOEGATE_ROOT`` (``moegate/paths.py``), never
site-packages. One line per command; exit 1 when any is not as expected.

    python tooling/wheel_check.py [--python PY] [--keep DIR] [-- UV_PIP_INSTALL_ARGS...]

The arguments after ``--`` go to ``uv pip install`` (the package sources: nox passes pip's
configured find-links and indexes and the CPU torch index, as for the unit env).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASE = '{"num_tokens": 1, "top_k": 1, "num_experts": 8}'
SUBCOMMANDS: tuple[str, ...] = (
    "gate",
    "e2e",
    "ab",
    "sweep",
    "preflight",
    "fetch-gsm8k",
    "power",
    "census",
    "make-build",
    "tiny-model",
)
SUBCOMMANDS += ("gsm8k",)
"""The front door's subcommands whose ``--help`` is checked, through the installed script (``repro`` and ``spec`` run
for real below); ``python -m moegate.e2e`` is the same ``main``."""
MODULES = (
    "moegate",
    "moegate.model.tiny_model",
    "moegate.model.engine",
    "moegate.builds.bench_serve",
    "moegate.builds.devsite",
)
"""The ``python -m`` command lines that are not a subcommand; the workflows' helpers (``tooling/ci/``) run from a
checkout, never from the wheel."""


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    status: int
    says: str
    """Text the output must contain."""


def commands(py: str, work: Path) -> list[Command]:
    """What runs in the fresh environment (``py``), in a folder outside the checkout (``work``)."""
    script = str(Path(py).parent / "moegate")
    out = [Command((script, "--help"), 0, "usage: moegate")]
    out += [Command((script, name, "--help"), 0, "usage:") for name in SUBCOMMANDS]
    out += [Command((py, "-m", m, "--help"), 0, "usage:") for m in MODULES]
    installed = (
        "import moegate, moegate.paths as p, pathlib, sys; from moegate.e2e import prompts; "
        "assert 'site-packages' in moegate.__file__, moegate.__file__; "
        f"assert p.GOLDEN_DIR == pathlib.Path({str(ROOT / 'golden')!r}), p.GOLDEN_DIR; "
        "print('prompts', len(prompts.prompt_set()), 'from', p.GOLDEN_DIR)"
    )
    # strategies/ is installed as moegate.strategies (pyproject.toml's package-dir), not read from the checkout
    strategies = (
        "import moegate.strategies as s; from moegate.strategies.kernels import kernel_cases; "
        "assert 'site-packages' in s.__file__, s.__file__; print('strategies', s.__name__, 'from', s.__file__)"
    )
    out += [
        Command((py, "-c", installed), 0, "prompts "),
        Command((script, "spec", CASE), 0, "legacy: naive"),
        Command((script, "repro", CASE), 2, "vLLM is not importable"),
        Command((py, "-m", "moegate", "spec", CASE), 0, "modular: naive"),
        Command((py, "-c", strategies), 0, "strategies "),
        Command((script, "sweep", "--cases", "4", "--workers", "2"), 2, "vLLM is not importable"),
        Command((script, "power", "--vllm-python", str(work / "none")), 2, "moegate power:"),
        Command((script, "gate", "--vllm-python", str(work / "none")), 2, "moegate gate: --vllm-python"),
        Command((script, "preflight", "--checks", "disk", "--need-disk-gib", "0", "--disk-path", str(work)), 0,
                "preflight: PASS"),
        Command((script, "fetch-gsm8k", "--dir", str(work / "g"), "--source", (work / "none").as_uri()), 1,
                "could not download"),
        # their pages into the scratch folder: by default they go to the checkout's reports/, which a CI job
        # publishes as its summary (the replayed unit job showed this command's ERROR page there)
        Command((script, "e2e", "run", "--base", str(work / "none"), "--pr", str(work / "none"),
                 "--model", str(work / "none"), "--out", str(work / "e2e-run"), "--report", str(work / "e2e.md")),
                2, "moegate.e2e"),
        Command((script, "ab", "--base-python", str(work / "none"), "--pr-python", str(work / "none"),
                 "--model", str(work / "none"), "--random-input-len", "8", "--out", str(work / "ab")), 2, ""),
    ]  # fmt: skip
    return out


def run(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tooling/wheel_check.py", description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable, help="the interpreter the fresh environment is made from")
    ap.add_argument("--keep", type=Path, help="build and install here, and keep it (default: a temporary folder)")
    ap.add_argument("install_args", nargs="*", help="for uv pip install (package sources)")
    args = ap.parse_args(argv)
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        print("wheel-check: needs uv (pip install uv)", file=sys.stderr)
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="moegate-wheel-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return _check(uv, args.python, work, args.install_args)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


def _check(uv: str, python: str, work: Path, install_args: list[str]) -> int:
    dist = work / "dist"
    subprocess.run(
        [uv, "build", "-q", "--out-dir", str(dist), str(ROOT)], check=True
    )  # the wheel from the sdist: no build/ in the tree
    wheel = next(dist.glob("moegate-*.whl"))
    venv = work / "venv"
    subprocess.run([uv, "venv", "-q", "--python", python, str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([uv, "pip", "install", "-q", "--python", py, *install_args, f"{wheel}[unit]"], check=True)
    env = {"MOEGATE_ROOT": str(ROOT), "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(work)}
    failed = 0
    for cmd in commands(py, work):
        proc = subprocess.run(cmd.argv, cwd=work, env=env, capture_output=True, text=True, timeout=300, check=False)
        output = proc.stdout + proc.stderr
        ok = proc.returncode == cmd.status and cmd.says in output
        failed += not ok
        shown = " ".join(a if len(a) < 60 else a[:57] + "..." for a in cmd.argv[1:])
        last = output.strip().splitlines()[-1:] or [""]
        print(f"{'ok  ' if ok else 'FAIL'} exit {proc.returncode} (want {cmd.status}): {Path(cmd.argv[0]).name} {shown}"
              + ("" if ok else f"\n     {last[0][:300]}"))  # fmt: skip
    print(f"wheel-check: {wheel.name}: {'every command as expected' if not failed else f'{failed} not as expected'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(run())
