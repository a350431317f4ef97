"""One power run: find the regions, build the overlay, pass the baseline, mutate, test, collect.

The installed files are only ever read: they are hashed before and after, and a
changed hash fails the run however it ends. The suite the mutants run against is
a frozen copy, taken when the run starts. Every test run uses a *build*: a venv made
from ``--vllm-python`` (``moegate.builds.planted.make_build``) whose path puts the overlay
and the frozen suite first, then that interpreter's own path, so every process of a
test run (the ones it starts with ``sys.executable`` too) imports the mutant and the
frozen suite; ``{python}`` in a test command stands for it. Each stage says how far it is
(``moegate.core.progress``): the baseline, then the mutants done of the total with the
running score.
"""

from __future__ import annotations

import ast
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
from typing import Any

from moegate.builds.planted import BuildError, make_build
from moegate.core import progress
from moegate.core.hashing import sha256_file
from moegate.dispatch import names
from moegate.paths import EQUIVALENT_MUTANTS, ROOT
from moegate.power import reach, summary_line
from moegate.power.driver import collect, keep_only, mark_skipped, require_tool, run_tool, select, tally
from moegate.power.errors import PowerError
from moegate.power.outcome import BUILD_PYTHON, Mutant, Outcome, load_equivalents, score
from moegate.power.overlay import build_overlay, clean_stale_workdirs, make_workdir, snapshot_suite
from moegate.power.regions import REGIONS, Region, RegionSpec, find_regions

EQUIVALENTS_FILE = EQUIVALENT_MUTANTS
PLUGIN = "moegate.power.plugin"  # loaded into each mutant's test run with -p
REACH_PLUGIN = "moegate.power.reach"  # loaded into one traced unmutated run with --prune-unreached


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
    specs: Sequence[RegionSpec] = REGIONS,
    groups: Sequence[str] = ("dispatch",),
    dry_run: bool = False,
    prune_unreached: bool = False,
    shard: tuple[int, int] | None = None,
    log: Callable[[str], object] = lambda msg: print(msg, file=sys.stderr, flush=True),
) -> Outcome:
    """Mutate, test, collect. The installed files are only ever read.

    ``specs``: the regions to mutate (``regions.GROUPS``, named by ``groups`` in the report).
    ``dry_run``: stop once the mutants are chosen (no baseline, no tests); they come back pending.
    ``prune_unreached``: trace one more unmutated run (``moegate.power.reach``); mutants on lines it
    never executes are ``unreached`` without a run. ``shard=(k, n)``: only every n-th mutant from the k-th.
    """
    t_start = time.perf_counter()
    require_tool()
    if package_dir is None:
        package_dir, version = probe_package_dir(vllm_python)
    version = version or "unknown"
    files = sorted({s.file for s in specs})
    missing = [f for f in files if not (package_dir / f).is_file()]
    sources = {f: (package_dir / f).read_text() for f in files if f not in missing}
    if missing:
        find_regions(sources, specs)  # reports the missing files together with anything else missing
    regions = find_regions(sources, specs, where=f"vLLM {version} at {package_dir}")
    equivalents = load_equivalents(equivalents_file, groups)
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
        if dry_run:
            mutants = _choose(work, copies, regions, test_command or default_test_command(), proc_env, tool_log, suite)
            if only or limit is not None or shard is not None:
                mutants = keep_only(work / "session.sqlite", mutants, only, limit, shard)
            return _outcome(
                version, package_dir, command, test_command or default_test_command(), vllm_python, regions, mutants,
                {}, t_start, before, equivalents, budget_s, suite_rev, groups, shard,
            )  # fmt: skip
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
                    f"the tests fail on unmutated vLLM {version} (exit {base.returncode}); "
                    f"a mutation score would mean nothing. Output tail:\n{(base.stdout + base.stderr)[-3000:]}"
                )
            for key, module in summary_line.WATCHED.items():
                loaded = info.get(key)
                mutated = names.package_file(module) in copies
                if mutated and loaded is not None and not str(loaded).startswith(str(work)):
                    raise PowerError(f"the test run loaded {loaded}, not the overlay copy; refusing to mutate")
            import_s = info.get("import_s")
            bar.result = "passed" + (f", vLLM import {import_s} s" if import_s is not None else "")
        baseline = {"wall_s": round(base_wall, 2), **{k: info.get(k) for k in ("import_s", "total_s")}}
        reached = _reach(command_run, copies, proc_env, suite) if prune_unreached else None
        cut = ""

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
        if only or limit is not None or shard is not None:  # a partial run: the rest is skipped in the session
            mutants = keep_only(db, mutants, only, limit, shard)
        if reached is not None:
            unreached = mark_unreached(mutants, copies, reached)
            mark_skipped(db, [m.job_id for m in unreached])
            log(f"power: {len(unreached)} of {len(mutants)} mutants sit on lines the tests never execute")
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

            try:
                run_tool("exec", str(cfg), str(db), env=proc_env, log=tool_log, what="exec", cwd=suite, on_tick=tick)
            except KeyboardInterrupt as exc:  # a shard's timeout: what ran is kept, the rest stays pending
                cut = f"cut by {str(exc) or 'signal 2 (SIGINT)'} while its mutants ran"
            collect(db, mutants, equivalents)
            show(Counter(m.status for m in mutants if m.status != "pending"))
        for f, p in copies.items():  # cosmic-ray restores each copy after its mutant (a cut one: the overlay goes)
            if not cut and sha256_file(p) != before[f]:
                raise PowerError(f"the overlay copy of {f} was left mutated by cosmic-ray: {p}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        after = {f: sha256_file(package_dir / f) for f in files}
        if after != before:
            raise PowerError(
                f"INSTALLED vLLM FILES CHANGED during the power run: {[f for f in files if after[f] != before[f]]}"
            )

    outcome = _outcome(
        version, package_dir, command, test_command, vllm_python, regions, mutants, baseline, t_start, before,
        equivalents, budget_s, suite_rev, groups, shard,
    )  # fmt: skip
    outcome.cut = cut
    return outcome


def _reach(command_run: str, copies: Mapping[str, Path], env: Mapping[str, str], cwd: Path) -> dict[str, set[int]]:
    """The lines of each mutated copy that one traced run of the unmutated tests executes."""
    with progress.stage("reach (unmutated, traced)", prefix="power") as bar:
        traced = subprocess.run(
            [*shlex.split(command_run), "-p", REACH_PLUGIN],
            check=False,
            cwd=cwd,
            env={**env, reach.ENV: json.dumps([str(p) for p in copies.values()])},
            capture_output=True,
            text=True,
        )
        lines = reach.read(traced.stdout)
        if traced.returncode != 0 or lines is None:
            raise PowerError(
                f"the traced run of the unmutated tests failed (exit {traced.returncode}) or printed no reach line; "
                f"output tail:\n{(traced.stdout + traced.stderr)[-2000:]}"
            )
        bar.result = f"{sum(len(v) for v in lines.values())} lines executed in {len(copies)} files"
    return lines


def _statement_spans(source: str) -> list[tuple[int, int]]:
    return [
        (n.lineno, n.end_lineno or n.lineno)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.stmt) and not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]


def mark_unreached(
    mutants: Sequence[Mutant], copies: Mapping[str, Path], reached: Mapping[str, set[int]]
) -> list[Mutant]:
    """Mark ``unreached`` each mutant whose innermost statement has no executed line; return them.

    The innermost statement (not just the line) so that a mutant in a multi-line expression
    counts as reached when any line of its statement ran: pruning may only err towards running.
    """
    out = []
    spans: dict[str, list[tuple[int, int]]] = {}
    for m in mutants:
        path = copies[m.file]
        if m.file not in spans:
            spans[m.file] = _statement_spans(path.read_text())
        hit = reached.get(str(path), set()) | reached.get(os.path.realpath(path), set())
        inner = min((s for s in spans[m.file] if s[0] <= m.line <= s[1]), key=lambda s: s[1] - s[0], default=None)
        lines = range(inner[0], inner[1] + 1) if inner else range(m.line, m.line + 1)
        if not any(n in hit for n in lines):
            m.status = "unreached"
            m.reason = f"the tests never execute line {m.line} (traced unmutated run)"
            out.append(m)
    return out


def _choose(
    work: Path,
    copies: Mapping[str, Path],
    regions: Sequence[Region],
    command_run: str,
    env: Mapping[str, str],
    tool_log: Path,
    cwd: Path,
) -> list[Mutant]:
    """cosmic-ray's session for the copies (``init``), its work items outside the regions marked skipped."""
    cfg = work / "cosmic-ray.toml"
    cfg.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps([str(p) for p in copies.values()])}\n"
        "timeout = 60.0\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command_run)}\n"
        "[cosmic-ray.distributor]\n"
        'name = "local"\n'
    )
    db = work / "session.sqlite"
    run_tool("init", str(cfg), str(db), env=env, log=tool_log, what="init", cwd=cwd)
    return select(db, copies, regions)


def _outcome(
    version: str,
    package_dir: Path,
    command: str,
    test_command: str,
    vllm_python: str,
    regions: Sequence[Region],
    mutants: list[Mutant],
    baseline: dict[str, Any],
    t_start: float,
    before: dict[str, str],
    equivalents: Mapping[str, str],
    budget_s: float,
    suite_rev: str,
    groups: Sequence[str],
    shard: tuple[int, int] | None = None,
) -> Outcome:
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
        groups=list(groups),
        shards=[] if shard is None else [f"{shard[0]}/{shard[1]}"],
    )
