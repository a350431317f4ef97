"""One power run: find the regions, build the overlay, pass the baseline, mutate, test, collect.

The installed files are only ever read: they are hashed before and after, and a
changed hash fails the run however it ends. The suite the mutants run against is
a frozen copy, taken when the run starts. Every test run uses a *build*: a venv made
from ``--vllm-python`` (``moegate.vllm.planted.make_build``) whose path puts the overlay
and the frozen suite first, then that interpreter's own path, so every process of a
test run (the ones it starts with ``sys.executable`` too) imports the mutant and the
frozen suite; ``{python}`` in a test command stands for it. Each stage says how far it is
(``moegate.core.progress``): the baseline, then the mutants done of the total with the
running score.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from moegate.core import progress
from moegate.core.hashing import sha256_file
from moegate.paths import EQUIVALENT_MUTANTS, ROOT
from moegate.power import summary_line
from moegate.power.driver import collect, keep_only, require_tool, run_tool, select, tally
from moegate.power.errors import PowerError
from moegate.power.outcome import BUILD_PYTHON, Outcome, load_equivalents, score
from moegate.power.overlay import build_overlay, clean_stale_workdirs, make_workdir, snapshot_suite
from moegate.power.regions import REGIONS, find_regions
from moegate.vllm import names
from moegate.vllm.planted import BuildError, make_build

EQUIVALENTS_FILE = EQUIVALENT_MUTANTS
PLUGIN = "moegate.power.plugin"  # loaded into each mutant's dispatch-tier run with -p


def probe_package_dir(vllm_python: str) -> tuple[Path, str]:
    """Where ``vllm`` is installed for ``vllm_python``, and its version, without importing vLLM."""
    code = (
        "import importlib.util, importlib.metadata as md, json\n"
        f"s = importlib.util.find_spec({names.PACKAGE!r})\n"
        "v = None\n"
        f"for d in {names.DISTRIBUTIONS!r}:\n"
        "    try: v = md.version(d); break\n"
        "    except md.PackageNotFoundError: pass\n"
        "print(json.dumps({'dir': list(s.submodule_search_locations)[0] if s else None, 'version': v}))\n"
    )
    try:
        out = subprocess.run([vllm_python, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise PowerError(f"cannot run {vllm_python}: {exc}") from exc
    info = json.loads(out.stdout.strip().splitlines()[-1])
    if not info["dir"]:
        raise PowerError(f"vLLM is not installed for {vllm_python}; point --vllm-python at an environment with vLLM")
    return Path(info["dir"]), info["version"] or "unknown"


def default_test_command() -> str:
    args = ["-m", "pytest", "tests/dispatch", "-x", "-q", "-p", PLUGIN, "-p", "no:cacheprovider"]
    return " ".join([BUILD_PYTHON, *(shlex.quote(a) for a in args)])


def make_test_build(work: Path, vllm_python: str, overlay: Path, suite: Path) -> Path:
    """The interpreter every test run uses: ``vllm_python``'s packages behind the overlay and the frozen suite."""
    try:
        return make_build(work / "build", vllm_python, sites=(str(overlay), str(suite)))
    except BuildError as exc:
        raise PowerError(f"cannot make the test build from {vllm_python}: {exc}") from exc


def run(
    vllm_python: str,
    *,
    out_dir: Path,
    package_dir: Path | None = None,
    version: str | None = None,
    test_command: str | None = None,
    timeout_s: float | None = None,
    limit: int | None = None,
    only: Sequence[str] = (),
    equivalents_file: Path = EQUIVALENTS_FILE,
    command: str = "",
    budget_s: float = 30.0,
    log: Callable[[str], object] = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> Outcome:
    """Mutate, test, collect. The installed files are only ever read."""
    t_start = time.perf_counter()
    require_tool()
    if package_dir is None:
        package_dir, version = probe_package_dir(vllm_python)
    version = version or "unknown"
    files = sorted({s.file for s in REGIONS})
    missing = [f for f in files if not (package_dir / f).is_file()]
    sources = {f: (package_dir / f).read_text() for f in files if f not in missing}
    if missing:
        find_regions(sources)  # reports the missing files together with anything else missing
    regions = find_regions(sources, where=f"vLLM {version} at {package_dir}")
    equivalents = load_equivalents(equivalents_file)
    before = {f: sha256_file(package_dir / f) for f in files}

    clean_stale_workdirs()
    work = make_workdir()
    out_dir.mkdir(parents=True, exist_ok=True)
    tool_log = out_dir / "power-cosmic-ray.log"
    tool_log.write_text("")
    suite = work / "suite"
    suite_rev = snapshot_suite(ROOT, suite)
    proc_env = {
        **os.environ,
        "MOEGATE_PROFILE": "power",
        "MOEGATE_REQUIRE_VLLM": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER": "1",
    }
    proc_env.pop("PYTEST_ADDOPTS", None)
    test_command = test_command or default_test_command()
    try:
        copies = build_overlay(package_dir, work / "overlay", files)
        build_python = make_test_build(work, vllm_python, work / "overlay", suite)
        command_run = test_command.replace(BUILD_PYTHON, shlex.quote(str(build_python)))
        # baseline: the unmutated overlay must pass, from the overlay, or no score means anything
        with progress.stage("baseline (unmutated vLLM)", prefix="power") as bar:
            t0 = time.perf_counter()
            base = subprocess.run(
                shlex.split(command_run), check=False, cwd=suite, env=proc_env, capture_output=True, text=True
            )
            base_wall = time.perf_counter() - t0
            info = summary_line.read(base.stdout) or {}
            if base.returncode != 0:
                raise PowerError(
                    f"the dispatch tier fails on unmutated vLLM {version} (exit {base.returncode}); "
                    f"a mutation score would mean nothing. Output tail:\n{(base.stdout + base.stderr)[-3000:]}"
                )
            for key in ("fused_moe_file", "triton_moe_file"):
                loaded = info.get(key)
                if loaded is not None and not str(loaded).startswith(str(work)):
                    raise PowerError(f"the test run loaded {loaded}, not the overlay copy; refusing to mutate")
            import_s = info.get("import_s")
            bar.result = "passed" + (f", vLLM import {import_s} s" if import_s is not None else "")
        baseline = {"wall_s": round(base_wall, 2), **{k: info.get(k) for k in ("import_s", "total_s")}}

        timeout = timeout_s or max(60.0, 4 * base_wall)
        cfg = work / "cosmic-ray.toml"
        cfg.write_text(
            "[cosmic-ray]\n"
            f"module-path = {json.dumps([str(copies[f]) for f in files])}\n"
            f"timeout = {float(timeout)}\n"
            "excluded-modules = []\n"
            f"test-command = {json.dumps(command_run)}\n"
            "[cosmic-ray.distributor]\n"
            'name = "local"\n'
        )
        db = work / "session.sqlite"
        run_tool("init", str(cfg), str(db), env=proc_env, log=tool_log, what="init", cwd=suite)
        mutants = select(db, copies, regions)
        if only or limit is not None:  # a partial run: the rest is marked skipped in cosmic-ray's session
            mutants = keep_only(db, mutants, only, limit)
        log(f"power: {len(mutants)} mutants in {len(regions)} regions; timeout {timeout:.0f} s each")
        with progress.stage("mutants", len(mutants), prefix="power", counts=("killed", "survived")) as bar:

            def show(counts: Mapping[str, int]) -> None:
                rate = score(counts)
                bar.result = "" if rate is None else f"score {100 * rate:.1f} %"
                bar.update(sum(counts.values()), **counts)

            def tick() -> None:
                counts = tally(db, mutants, equivalents)
                if counts is not None:
                    show(counts)

            run_tool("exec", str(cfg), str(db), env=proc_env, log=tool_log, what="exec", cwd=suite, on_tick=tick)
            collect(db, mutants, equivalents)
            show(Counter(m.status for m in mutants if m.status != "pending"))
        for f, p in copies.items():  # cosmic-ray restores each copy after its mutant
            if sha256_file(p) != before[f]:
                raise PowerError(f"the overlay copy of {f} was left mutated by cosmic-ray: {p}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        after = {f: sha256_file(package_dir / f) for f in files}
        if after != before:
            raise PowerError(
                f"INSTALLED vLLM FILES CHANGED during the power run: {[f for f in files if after[f] != before[f]]}"
            )

    ids = {m.id for m in mutants}
    return Outcome(
        vllm_version=version,
        package_dir=str(package_dir),
        command=command,
        test_command=test_command,
        vllm_python=vllm_python,
        regions=[
            {"region": r.spec.label, "file": r.spec.file, "lines": f"{r.first}-{r.last}", "why": r.spec.why}
            for r in regions
        ],
        mutants=mutants,
        baseline=baseline,
        wall_s=round(time.perf_counter() - t_start, 1),
        installed_hashes=before,
        installed_unchanged=True,
        stale_equivalents=sorted(k for k in equivalents if k not in ids),
        budget_s=budget_s,
        suite_rev=suite_rev,
    )
