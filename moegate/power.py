"""Gate power: mutation-test vLLM's fused-MoE dispatch code and measure how fast the suite kills each mutant.

A gate is only as good as the bugs it catches. This harness plants bugs in the
installed vLLM's dispatch code with cosmic-ray (an established mutation tool; no
mutation engine of our own), runs the dispatch tier against each mutant, and
reports killed / survived / timed-out mutants, the mutation score and, for each
killed mutant, the time to the first failing example.

What is mutated, and only that (``REGIONS``): the bodies of
``_weights_host_resident`` and ``_prepare_expert_assignment``, and at both public
entrypoints the lines that compute and pass the residency flag and the expert
count. Regions are found by parsing vLLM's source (``ast``), never by line
numbers, so a new release is re-targeted automatically or refused with one error
that names what was looked for.

The installed vLLM is never written. cosmic-ray mutates files in place, so it is
pointed at an *overlay*: a throw-away directory holding a ``vllm`` package tree
made of symlinks to the installed one, except along the paths to the mutated
files, which are real directories, and the mutated files themselves, which are
real copies (new inodes: writing them cannot reach the installed file). The
overlay goes first on ``PYTHONPATH`` of each test run. The installed files are
hashed before and after; whatever ends the run (interrupt, timeout, crash, even
SIGKILL) can only leave a stale overlay in the temp dir, which the next run
removes. ``tests/unit/test_power.py`` proves that by killing a run mid-mutant.

This module treats vLLM as text: it parses and copies files, it never imports
vLLM (``moegate.vllm`` is the only package that drives vLLM); the names it looks
for come from ``moegate.vllm.names``.

Run it through nox (``nox -s power``), or directly with the Python of an
environment that has cosmic-ray::

    python -m moegate.power --vllm-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from moegate.vllm import names

ROOT = Path(__file__).resolve().parent.parent
TOOL = "cosmic-ray"
TOOL_INSTALL = "pip install 'cosmic-ray>=8.7,<9'  (or: pip install 'moegate[power]')"
EQUIVALENTS_FILE = ROOT / "power" / "equivalent-mutants.toml"
PLUGIN_MARK = "MOEGATE-POWER"
WORKDIR_PREFIX = "moegate-power-"

FUSED_MOE = names.package_file(names.FUSED_MOE)  # model_executor/layers/fused_moe/fused_moe.py
TRITON_MOE = names.package_file(names.TRITON_MOE)


class PowerError(RuntimeError):
    """Bad input or a broken run; the message is the one line a user needs."""


class TargetNotFound(PowerError):
    """The vLLM sources lack a function, assignment or call the regions name."""


class ToolMissing(PowerError):
    """cosmic-ray is not importable by the harness's Python."""


# --- what to mutate ------------------------------------------------------------------


@dataclass(frozen=True)
class RegionSpec:
    """A piece of vLLM's source to mutate, named by structure, never by line number.

    ``kind``:
    - ``body``: every statement of function ``scope`` after its docstring (the
      signature's defaults are left alone: both entrypoints pass every argument).
    - ``assign``: the statement(s) in ``scope`` assigning the name ``name``.
    - ``call-args``: in ``scope``'s call(s) to ``name``, the arguments that bind
      the callee's parameters ``params`` (positionally or by keyword).
    """

    file: str  # relative to the vllm package directory
    scope: str  # qualified name: "func" or "Class.method"
    kind: Literal["body", "assign", "call-args"]
    why: str
    name: str = ""
    params: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        detail = {"body": "body", "assign": f"{self.name} = ...", "call-args": f"{self.name}({', '.join(self.params)})"}
        return f"{Path(self.file).name}::{self.scope} [{detail[self.kind]}]"


REGIONS: tuple[RegionSpec, ...] = (
    RegionSpec(FUSED_MOE, names.WEIGHTS_HOST_RESIDENT, "body", "computes residency: either weight UVA-offloaded"),
    RegionSpec(FUSED_MOE, names.PREPARE_EXPERT_ASSIGNMENT, "body", "the naive/sorted decision and both assignments"),
    RegionSpec(
        FUSED_MOE,
        names.FUSED_EXPERTS_IMPL,
        "call-args",
        "legacy entrypoint: passes the expert count and the residency flag",
        name=names.PREPARE_EXPERT_ASSIGNMENT,
        params=("global_num_experts", "weights_host_resident"),
    ),
    RegionSpec(
        TRITON_MOE,
        names.TRITON_EXPERTS_APPLY,
        "assign",
        "modular entrypoint: counts experts (w1.shape[0] unless an expert map is given)",
        name=names.NUM_ALIGN_EXPERTS,
    ),
    RegionSpec(
        TRITON_MOE,
        names.TRITON_EXPERTS_APPLY,
        "call-args",
        "modular entrypoint: passes the expert count and the residency flag",
        name=names.PREPARE_EXPERT_ASSIGNMENT,
        params=("global_num_experts", "weights_host_resident"),
    ),
)


@dataclass(frozen=True)
class Region:
    """A ``RegionSpec`` located in one release's source: lines ``first..last`` (1-based, inclusive)."""

    spec: RegionSpec
    first: int
    last: int
    anchor: int  # line of the enclosing ``def``: mutant ids count lines from here

    def contains(self, line: int) -> bool:
        return self.first <= line <= self.last


FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def find_function(tree: ast.Module, qualname: str) -> FunctionNode | None:
    """The def of ``qualname`` ("f" or "Class.method") at module/class level, else None."""
    scope: Sequence[ast.stmt] = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        kinds: tuple[type, ...] = (ast.FunctionDef, ast.AsyncFunctionDef) if last else (ast.ClassDef,)
        node = next((n for n in scope if isinstance(n, kinds) and n.name == part), None)  # type: ignore[attr-defined]
        if node is None:
            return None
        if last:
            return node  # type: ignore[return-value]
        scope = node.body  # type: ignore[attr-defined]
    return None


def _body_lines(fn: FunctionNode) -> tuple[int, int] | None:
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        if isinstance(body[0].value.value, str):  # the docstring: nothing to mutate
            body = body[1:]
    if not body:
        return None
    return body[0].lineno, max(n.end_lineno or n.lineno for n in body)


def _own_nodes(fn: FunctionNode) -> Iterator[ast.AST]:
    """Nodes of ``fn`` outside nested defs/classes (those are other scopes)."""
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _callee_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _positional_params(trees: Mapping[str, ast.Module], name: str) -> list[str] | None:
    """Positional parameter names of the module-level function ``name`` in any of ``trees``."""
    for tree in trees.values():
        fn = find_function(tree, name)
        if fn is not None:
            return [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    return None


def locate(spec: RegionSpec, trees: Mapping[str, ast.Module]) -> tuple[list[Region], str | None]:
    """Regions for ``spec`` in ``trees`` (file -> parsed module), or a description of what is missing."""
    tree = trees.get(spec.file)
    if tree is None:
        return [], f"file {spec.file}"
    fn = find_function(tree, spec.scope)
    if fn is None:
        return [], f"function {spec.scope} in {spec.file}"
    if spec.kind == "body":
        lines = _body_lines(fn)
        if lines is None:
            return [], f"a body (statements after the docstring) in {spec.scope} in {spec.file}"
        return [Region(spec, lines[0], lines[1], fn.lineno)], None
    if spec.kind == "assign":
        found = [
            Region(spec, n.lineno, n.end_lineno or n.lineno, fn.lineno)
            for n in _own_nodes(fn)
            if isinstance(n, ast.Assign | ast.AnnAssign)
            and any(
                isinstance(t, ast.Name) and t.id == spec.name
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            )
        ]
        return (
            (sorted(found, key=lambda r: r.first), None)
            if found
            else ([], f"an assignment to {spec.name} in {spec.scope} in {spec.file}")
        )
    calls = [n for n in _own_nodes(fn) if isinstance(n, ast.Call) and _callee_name(n) == spec.name]
    if not calls:
        return [], f"a call to {spec.name} in {spec.scope} in {spec.file}"
    positional = _positional_params(trees, spec.name) or []
    regions: list[Region] = []
    for call in calls:
        for param in spec.params:
            node: ast.AST | None = next((k.value for k in call.keywords if k.arg == param), None)
            if node is None and param in positional:
                idx = positional.index(param)
                plain = [a for a in call.args if not isinstance(a, ast.Starred)]
                if len(plain) == len(call.args) and idx < len(call.args):
                    node = call.args[idx]
            if node is None:
                return [], f"argument {param} in the call to {spec.name} in {spec.scope} in {spec.file}"
            regions.append(Region(spec, node.lineno, node.end_lineno or node.lineno, fn.lineno))  # type: ignore[attr-defined]
    return sorted(regions, key=lambda r: r.first), None


def find_regions(
    sources: Mapping[str, str], specs: Sequence[RegionSpec] = REGIONS, *, where: str = "vLLM"
) -> list[Region]:
    """Every region of ``specs`` in ``sources`` (file -> text); one error naming everything missing."""
    trees: dict[str, ast.Module] = {}
    for name, text in sources.items():
        try:
            trees[name] = ast.parse(text, filename=name)
        except SyntaxError as exc:
            raise TargetNotFound(f"{where}: cannot parse {name}: {exc}") from exc
    regions: list[Region] = []
    missing: list[str] = []
    for spec in specs:
        found, problem = locate(spec, trees)
        if problem:
            missing.append(problem)
        regions.extend(found)
    if missing:
        raise TargetNotFound(
            f"{where} does not contain the dispatch code moegate mutates; looked for: {'; '.join(dict.fromkeys(missing))}"
        )
    return regions


# --- the throw-away overlay -----------------------------------------------------------


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_overlay(package_dir: Path, overlay_root: Path, files: Sequence[str]) -> dict[str, Path]:
    """Mirror ``package_dir`` under ``overlay_root`` with real copies of ``files``; return their copies.

    Directories on the way to a copied file are real (so the copy can sit in
    them); every other entry is a symlink into the installed package; no
    ``__pycache__`` is mirrored into a real directory (a stale pyc of the
    unmutated file must never be loaded for a mutant).
    """
    dst_pkg = overlay_root / package_dir.name
    real_dirs = {Path(".")}
    for f in files:
        real_dirs.update(Path(f).parents)
    copies = {Path(f) for f in files}
    for rel in sorted(real_dirs, key=lambda p: len(p.parts)):
        (dst_pkg / rel).mkdir(parents=True, exist_ok=True)
        for entry in (package_dir / rel).iterdir():
            sub = rel / entry.name
            if entry.name == "__pycache__" or sub in real_dirs or sub in copies:
                continue
            os.symlink(entry, dst_pkg / sub)
    out: dict[str, Path] = {}
    for f in files:
        src, dst = package_dir / f, dst_pkg / f
        shutil.copyfile(src, dst)  # a new inode with a fresh mtime, never a link
        out[f] = dst
    return out


SUITE_PATHS = ("moegate", "strategies", "tests", "golden", "pyproject.toml")


def snapshot_suite(root: Path, dest: Path) -> str:
    """Copy the suite (tests, strategies, spec, adapter, goldens) the mutants run against; return its git revision.

    A mutation run takes many minutes; edits landing in the working tree meanwhile
    must not change the suite half-way through (the baseline would no longer vouch
    for it), so every test run uses this frozen copy.
    """
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "*.obtained")
    for name in SUITE_PATHS:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copyfile(src, dest / name)
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", *SUITE_PATHS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return rev + (" + uncommitted changes" if dirty else "")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_workdirs(tmp: Path | None = None) -> list[Path]:
    """Remove overlays left by runs that were killed (their owner pid is gone)."""
    removed = []
    for d in Path(tmp or tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
        pid_file = d / "owner.pid"
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            pid = -1
        if pid > 0 and _pid_alive(pid):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


# --- cosmic-ray ----------------------------------------------------------------------


def require_tool() -> None:
    """cosmic-ray must be importable by this Python; else one line with the install command."""
    if importlib.util.find_spec("cosmic_ray") is None:
        raise ToolMissing(f"{TOOL} is not installed for {sys.executable}; install it with: {TOOL_INSTALL}")


def _cosmic_ray(*args: str, env: Mapping[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "cosmic_ray.cli", *args],
            cwd=cwd,
            env=dict(env),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )


def _descendants(pid: int) -> list[int]:
    """Pids below ``pid`` (cosmic-ray starts each test run in a new session, out of our group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            ppid = int(text.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` and everything it started, by pid."""
    if proc.poll() is not None:
        return
    for pid in [*_descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def _run_tool(*args: str, env: Mapping[str, str], log: Path, what: str, cwd: Path) -> None:
    proc = _cosmic_ray(*args, env=env, log=log, cwd=cwd)
    try:
        rc = proc.wait()
    finally:
        _stop(proc)
    if rc != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise PowerError(f"cosmic-ray {what} failed (exit {rc}); log {log}:\n{tail}")


@dataclass
class Mutant:
    """One cosmic-ray work item inside a region, with its result."""

    id: str  # stable across releases: file:scope:operator@+line-offset:col[#k]
    job_id: str
    file: str
    line: int
    operator: str
    region: str
    status: str = "pending"  # killed | survived | timeout | incompetent | equivalent | no-mutation | pending
    first_failure_s: float | None = None
    failing_test: str | None = None
    via: str | None = None
    wall_s: float | None = None
    diff: str = ""
    reason: str = ""  # equivalent: why; incompetent/killed-by-error: first line of output


def mutant_id(region: Region, operator: str, line: int, col: int) -> str:
    short = operator.split("/", 1)[-1]
    return f"{Path(region.spec.file).stem}:{region.spec.scope}:{short}@+{line - region.anchor}:{col}"


def select(db_path: Path, copies: Mapping[str, Path], regions: Sequence[Region]) -> list[Mutant]:
    """Mark every work item outside the regions skipped (cosmic-ray's filter API); return those inside."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    by_path = {str(p): f for f, p in copies.items()}
    keep: list[Mutant] = []
    skip: list[str] = []
    seen: dict[str, int] = {}
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        items = sorted(
            db.work_items,
            key=lambda w: (
                str(w.mutations[0].module_path),
                w.mutations[0].start_pos,
                w.mutations[0].operator_name,
                w.mutations[0].occurrence,
            ),
        )
        for item in items:
            m = item.mutations[0]
            f = by_path.get(str(m.module_path))
            line, col = m.start_pos
            region = next((r for r in regions if f == r.spec.file and r.contains(line)), None)
            if region is None:
                skip.append(item.job_id)
                continue
            base = mutant_id(region, m.operator_name, line, col)
            k = seen.get(base, 0)
            seen[base] = k + 1
            keep.append(
                Mutant(
                    base if k == 0 else f"{base}#{k}", item.job_id, f or "", line, m.operator_name, region.spec.label
                )
            )
        db.set_multiple_results(skip, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    return keep


def read_plugin_line(output: str | None) -> dict[str, Any] | None:
    """The power plugin's summary from a test run's output, if it printed one."""
    for line in reversed((output or "").splitlines()):
        if line.startswith(PLUGIN_MARK + " "):
            with contextlib.suppress(ValueError):
                return json.loads(line[len(PLUGIN_MARK) + 1 :])
    return None


def load_equivalents(path: Path = EQUIVALENTS_FILE) -> dict[str, str]:
    """Reviewed equivalent mutants: id -> reason. Every entry needs a non-empty reason."""
    if not path.exists():
        return {}
    data = tomllib.loads(path.read_text())
    out: dict[str, str] = {}
    for key, entry in data.get("mutant", {}).items():
        reason = entry.get("reason", "").strip() if isinstance(entry, dict) else ""
        if not reason:
            raise PowerError(f"{path}: equivalent mutant {key!r} has no reason; say why it cannot change behaviour")
        out[key] = reason
    return out


def _relative_diff(diff: str) -> str:
    """Diff headers name ``vllm/...`` instead of the throw-away overlay's temp path."""
    out = []
    for line in diff.splitlines():
        if line.startswith(("--- a/", "+++ b/")) and "/overlay/" in line:
            line = line[:6] + line.split("/overlay/", 1)[1]
        out.append(line)
    return "\n".join(out)


def collect(db_path: Path, mutants: list[Mutant], equivalents: Mapping[str, str]) -> None:
    """Fill each mutant's status from cosmic-ray's session database and the plugin's line."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    with use_db(str(db_path), WorkDB.Mode.open) as db:
        results = dict(db.results)
    for m in mutants:
        r = results.get(m.job_id)
        if r is None:
            continue
        m.diff = _relative_diff(r.diff or "")
        if r.worker_outcome == WorkerOutcome.NO_TEST:
            m.status = "no-mutation"
            continue
        if r.worker_outcome != WorkerOutcome.NORMAL or r.test_outcome == TestOutcome.INCOMPETENT:
            m.status = "incompetent"
            m.reason = (r.output or "").strip().splitlines()[-1:][0] if r.output else str(r.worker_outcome)
            continue
        if r.test_outcome == TestOutcome.SURVIVED:
            m.status = "equivalent" if m.id in equivalents else "survived"
            m.reason = equivalents.get(m.id, "")
            continue
        if (r.output or "") == "timeout":
            m.status = "timeout"
            continue
        m.status = "killed"
        info = read_plugin_line(r.output)
        if info is None or info.get("first_failure_s") is None:
            m.reason = "killed without a failing test (collection/import error): " + next(
                (ln for ln in (r.output or "").splitlines() if "Error" in ln), "no plugin line"
            )
        else:
            m.first_failure_s = info["first_failure_s"]
            m.failing_test = info.get("failing_test")
            m.via = info.get("via")
            m.wall_s = info.get("total_s")


# --- the run -------------------------------------------------------------------------


@dataclass
class Outcome:
    vllm_version: str
    package_dir: str
    command: str
    test_command: str
    regions: list[dict[str, Any]]
    mutants: list[Mutant]
    baseline: dict[str, Any]
    wall_s: float
    installed_hashes: dict[str, str]
    installed_unchanged: bool
    stale_equivalents: list[str] = field(default_factory=list)
    budget_s: float = 30.0
    suite_rev: str = "unknown"

    def count(self, status: str) -> int:
        return sum(1 for m in self.mutants if m.status == status)

    @property
    def scored(self) -> int:
        return sum(1 for m in self.mutants if m.status in ("killed", "timeout", "survived", "incompetent"))

    @property
    def score(self) -> float | None:
        return None if not self.scored else (self.count("killed") + self.count("timeout")) / self.scored

    @property
    def passed(self) -> bool:
        return (
            self.count("survived") == 0
            and self.count("incompetent") == 0
            and self.count("pending") == 0
            and self.installed_unchanged
        )


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


def default_test_command(vllm_python: str) -> str:
    return " ".join(
        shlex.quote(a)
        for a in [
            vllm_python,
            "-m",
            "pytest",
            "tests/dispatch",
            "-x",
            "-q",
            "-p",
            "moegate.power_plugin",
            "-p",
            "no:cacheprovider",
        ]
    )


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
    log: Any = print,
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
    before = {f: sha256(package_dir / f) for f in files}

    clean_stale_workdirs()
    work = Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
    (work / "owner.pid").write_text(str(os.getpid()))
    out_dir.mkdir(parents=True, exist_ok=True)
    tool_log = out_dir / "power-cosmic-ray.log"
    tool_log.write_text("")
    suite = work / "suite"
    suite_rev = snapshot_suite(ROOT, suite)
    proc_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(work / "overlay"), str(suite)]),
        "MOEGATE_PROFILE": "power",
        "MOEGATE_REQUIRE_VLLM": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HYPOTHESIS_EXPERIMENTAL_OBSERVABILITY_NOCOVER": "1",
    }
    proc_env.pop("PYTEST_ADDOPTS", None)
    test_command = test_command or default_test_command(vllm_python)
    try:
        copies = build_overlay(package_dir, work / "overlay", files)
        # baseline: the unmutated overlay must pass, from the overlay, or no score means anything
        t0 = time.perf_counter()
        base = subprocess.run(shlex.split(test_command), cwd=suite, env=proc_env, capture_output=True, text=True)
        base_wall = time.perf_counter() - t0
        info = read_plugin_line(base.stdout) or {}
        if base.returncode != 0:
            raise PowerError(
                f"the dispatch tier fails on unmutated vLLM {version} (exit {base.returncode}); "
                f"a mutation score would mean nothing. Output tail:\n{(base.stdout + base.stderr)[-3000:]}"
            )
        for key in ("fused_moe_file", "triton_moe_file"):
            loaded = info.get(key)
            if loaded is not None and not str(loaded).startswith(str(work)):
                raise PowerError(f"the test run loaded {loaded}, not the overlay copy; refusing to mutate")
        baseline = {"wall_s": round(base_wall, 2), **{k: info.get(k) for k in ("import_s", "total_s")}}
        log(f"power: baseline dispatch tier passed in {base_wall:.1f} s (vLLM import {info.get('import_s')} s)")

        timeout = timeout_s or max(60.0, 4 * base_wall)
        cfg = work / "cosmic-ray.toml"
        cfg.write_text(
            "[cosmic-ray]\n"
            f"module-path = {json.dumps([str(copies[f]) for f in files])}\n"
            f"timeout = {float(timeout)}\n"
            "excluded-modules = []\n"
            f"test-command = {json.dumps(test_command)}\n"
            "[cosmic-ray.distributor]\n"
            'name = "local"\n'
        )
        db = work / "session.sqlite"
        _run_tool("init", str(cfg), str(db), env=proc_env, log=tool_log, what="init", cwd=suite)
        mutants = select(db, copies, regions)
        if only or limit is not None:  # a partial run: the rest is marked skipped in cosmic-ray's session
            from cosmic_ray.work_db import WorkDB, use_db
            from cosmic_ray.work_item import WorkerOutcome, WorkResult

            chosen = [m for m in mutants if not only or m.id in only]
            chosen = chosen[:limit] if limit is not None else chosen
            dropped = [m.job_id for m in mutants if m not in chosen]
            with use_db(str(db), WorkDB.Mode.open) as wdb:
                wdb.set_multiple_results(dropped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
            mutants = chosen
        log(f"power: {len(mutants)} mutants in {len(regions)} regions; timeout {timeout:.0f} s each")
        _run_tool("exec", str(cfg), str(db), env=proc_env, log=tool_log, what="exec", cwd=suite)
        collect(db, mutants, equivalents)
        for f, p in copies.items():  # cosmic-ray restores each copy after its mutant
            if sha256(p) != before[f]:
                raise PowerError(f"the overlay copy of {f} was left mutated by cosmic-ray: {p}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        after = {f: sha256(package_dir / f) for f in files}
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


# --- the report ----------------------------------------------------------------------


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def render_markdown(o: Outcome) -> str:
    """The report page; plain GitHub Markdown, fit for $GITHUB_STEP_SUMMARY."""
    score = "n/a" if o.score is None else f"{100 * o.score:.1f} %"
    killed = [m for m in o.mutants if m.status in ("killed", "timeout")]
    times = [m.first_failure_s for m in killed if m.first_failure_s is not None]
    over = [m for m in killed if m.first_failure_s is None or m.first_failure_s > o.budget_s]
    verdict = "PASS" if o.passed else "FAIL"
    lines = [
        f"# Gate power: vLLM {o.vllm_version} fused-MoE dispatch, mutation testing",
        "",
        f"**{verdict}: mutation score {score}**: {o.count('killed')} killed, {o.count('timeout')} timed out, "
        f"{o.count('survived')} survived, {o.count('incompetent')} incompetent of {o.scored} scored mutants; "
        f"{o.count('equivalent')} equivalent (reviewed), {o.count('no-mutation')} no-op.",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| mutants in scope | {len(o.mutants)} |",
        f"| time to first failing example (s, vLLM import excluded) | "
        + (f"median {sorted(times)[len(times) // 2]:.2f}, max {max(times):.2f}" if times else "-")
        + " |",
        f"| killed within {o.budget_s:.0f} s | {len(killed) - len(over)} of {len(killed)} |",
        f"| dispatch tier on unmutated vLLM (s) | wall {o.baseline.get('wall_s')}, import {o.baseline.get('import_s')}, pytest total {o.baseline.get('total_s')} |",
        f"| total wall time (s) | {o.wall_s} |",
        f"| installed vLLM files unchanged (sha256 before = after) | {'yes' if o.installed_unchanged else 'NO'} |",
        f"| suite (moegate revision, frozen for the run) | {o.suite_rev} |",
        f"| tool | {TOOL} (local distributor), mutants run against a throw-away overlay |",
        "",
        f"Command: `{o.command or 'python -m moegate.power'}`  ",
        f"Test command per mutant: `{o.test_command}` (MOEGATE_PROFILE=power)",
        "",
        "## Regions mutated",
        "",
        "| region | file | lines | why |",
        "| --- | --- | --- | --- |",
        *[f"| `{r['region']}` | `{r['file']}` | {r['lines']} | {r['why']} |" for r in o.regions],
        "",
        "## Survivors",
        "",
    ]
    survivors = [m for m in o.mutants if m.status in ("survived", "incompetent")]
    if not survivors:
        lines.append("None.")
    for m in survivors:
        lines += [
            f"### `{m.id}` ({m.status})",
            "",
            f"line {m.line}, `{m.region}`" + (f": {m.reason}" if m.reason else ""),
            "",
            "```diff",
            m.diff.strip(),
            "```",
            "",
        ]
    lines += ["", "## Equivalent mutants (reviewed in power/equivalent-mutants.toml)", ""]
    eq = [m for m in o.mutants if m.status == "equivalent"]
    lines += [f"- `{m.id}`: {m.reason}" for m in eq] or ["None."]
    if o.stale_equivalents:
        lines += [
            "",
            "Entries in power/equivalent-mutants.toml that match no mutant of this release: "
            + ", ".join(f"`{k}`" for k in o.stale_equivalents),
        ]
    lines += [
        "",
        "## Killed mutants",
        "",
        "| mutant | line | first failure (s) | pytest total (s) | first failing test |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in killed:
        test = (m.failing_test or m.reason or "timeout").replace("|", "\\|")
        lines.append(
            f"| `{m.id}` | {m.line} | {_fmt_s(m.first_failure_s) if m.status == 'killed' else 'timeout'} | {_fmt_s(m.wall_s)} | {test} |"
        )
    return "\n".join(lines) + "\n"


def to_json(o: Outcome) -> dict[str, Any]:
    d = dataclasses.asdict(o)
    d["score"] = o.score
    d["passed"] = o.passed
    return d


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m moegate.power", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--vllm-python", required=True, help="Python of the environment whose installed vLLM is mutated (never written)"
    )
    p.add_argument("--out", default=str(ROOT / "reports"), help="where power.md / power.json / the tool log go")
    p.add_argument(
        "--timeout", type=float, default=None, help="seconds per mutant (default: max(60, 4x the unmutated tier))"
    )
    p.add_argument("--limit", type=int, default=None, help="run only the first N mutants in scope (smoke runs)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only the mutant with this id (repeatable), e.g. to re-check survivors",
    )
    p.add_argument("--test-command", default=None, help="override the per-mutant test command (tests of this harness)")
    p.add_argument(
        "--package-dir", default=None, help="the vllm package directory (default: probed from --vllm-python)"
    )
    p.add_argument(
        "--budget",
        type=float,
        default=30.0,
        help="per-mutant time-to-first-failure target, seconds (reported, not enforced)",
    )
    args = p.parse_args(argv)

    def _term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with SIGINT ignored
    out_dir = Path(args.out)
    try:
        outcome = run(
            args.vllm_python,
            out_dir=out_dir,
            package_dir=Path(args.package_dir) if args.package_dir else None,
            test_command=args.test_command,
            timeout_s=args.timeout,
            limit=args.limit,
            only=args.only,
            command=os.environ.get(
                "MOEGATE_POWER_COMMAND",
                "python -m moegate.power "
                + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
            ),
            budget_s=args.budget,
        )
    except PowerError as exc:
        print(f"moegate power: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(
            f"moegate power: interrupted ({exc or 'SIGINT'}); overlay removed, installed vLLM files unchanged",
            file=sys.stderr,
        )
        return 130
    md = render_markdown(outcome)
    (out_dir / "power.md").write_text(md)
    (out_dir / "power.json").write_text(json.dumps(to_json(outcome), indent=2, default=str))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as fh:
            fh.write(md)
    print(md)
    return 0 if outcome.passed else 1


if __name__ == "__main__":
    sys.exit(main())
