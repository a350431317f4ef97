"""The cosmic-ray driver: run the tool, choose the work items inside the regions, read the results back.

cosmic-ray (an established mutation tool; no mutation engine of our own) is run
as a subprocess of this Python (``init`` makes its session database, ``exec``
applies each mutant to the overlay and runs the test command); its filter API
marks every work item outside the regions skipped. While ``exec`` runs, the
session database is read every few seconds, so a long run can say how far it is
with the same classification the final report uses.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from moegate.power import summary_line
from moegate.power.errors import PowerError, ToolMissing
from moegate.power.outcome import Mutant, mutant_id
from moegate.power.regions import Region
from moegate.serve.processes import stop_tree

TOOL = "cosmic-ray"
TOOL_INSTALL = "pip install 'cosmic-ray>=8.7,<9'  (or: pip install 'moegate[power]')"


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


def run_tool(
    *args: str,
    env: Mapping[str, str],
    log: Path,
    what: str,
    cwd: Path,
    on_tick: Callable[[], None] | None = None,
    tick_s: float = 2.0,
) -> None:
    """One cosmic-ray command; ``on_tick`` is called every ``tick_s`` while it runs; its tree is killed at the end."""
    proc = _cosmic_ray(*args, env=env, log=log, cwd=cwd)
    try:
        while True:
            try:
                rc = proc.wait(timeout=tick_s if on_tick else None)
                break
            except subprocess.TimeoutExpired:
                assert on_tick is not None
                on_tick()
    finally:
        stop_tree(proc)
    if rc != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise PowerError(f"cosmic-ray {what} failed (exit {rc}); log {log}:\n{tail}")


def mark_skipped(db_path: Path, job_ids: Sequence[str]) -> None:
    """Mark work items skipped in cosmic-ray's session (``exec`` then leaves them alone)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(db_path), WorkDB.Mode.open) as db:
        db.set_multiple_results(list(job_ids), WorkResult(worker_outcome=WorkerOutcome.SKIPPED))


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


def keep_only(
    db_path: Path,
    mutants: list[Mutant],
    only: Sequence[str],
    limit: int | None,
    shard: tuple[int, int] | None = None,
) -> list[Mutant]:
    """A partial run: the mutants named in ``only`` (all if empty), every n-th from the k-th for ``shard=(k, n)``,
    the first ``limit`` of them; the rest skipped."""
    chosen = [m for m in mutants if not only or m.id in only]
    if shard is not None:
        k, n = shard
        chosen = chosen[k::n]
    chosen = chosen[:limit] if limit is not None else chosen
    mark_skipped(db_path, [m.job_id for m in mutants if m not in chosen])
    return chosen


def relative_diff(diff: str) -> str:
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
        if r is None or m.status == "unreached":  # unreached: skipped in the session, known without a run
            continue
        m.diff = relative_diff(r.diff or "")
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
        info = summary_line.read(r.output)
        if info is None or info.get("first_failure_s") is None:
            m.reason = "killed without a failing test (collection/import error): " + next(
                (ln for ln in (r.output or "").splitlines() if "Error" in ln), "no plugin line"
            )
        else:
            m.first_failure_s = info["first_failure_s"]
            m.failing_test = info.get("failing_test")
            m.via = info.get("via")
            m.wall_s = info.get("total_s")


def tally(db_path: Path, mutants: Sequence[Mutant], equivalents: Mapping[str, str]) -> Counter[str] | None:
    """Statuses of the mutants done so far, read while ``exec`` writes the session; None if it is busy.

    The same ``collect`` on copies, so the running score is the one the report will show.
    """
    from sqlalchemy.exc import OperationalError  # cosmic-ray's database layer

    probe = [dataclasses.replace(m) for m in mutants]
    try:
        collect(db_path, probe, equivalents)
    except OperationalError:  # the writer holds the lock: next tick
        return None
    return Counter(m.status for m in probe if m.status != "pending")
