"""Resuming an A/B run: the run on disk and the one asked for must be the same experiment."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from moegate.ab.plan import DriverError, Run
from moegate.ab.verdict import completed_rounds


def check_same_experiment(path: Path, old: Run, mine: Run, starts: int, log: Callable[[str], None]) -> None:
    """Raise ``DriverError`` unless ``old`` (read from ``path``) may be resumed as ``mine``: the same plan (it may
    only grow by whole rounds: ``schedule(n)`` is a prefix of ``schedule(n + k)``, so the interleaving holds, and
    only before its first look), the same workload, the same builds by label, server flags and model (by content
    where both runs kept its hash). What changed but may (a build's interpreter, a plan that grows) is logged."""
    same_plan = {k: v for k, v in json.loads(json.dumps(mine.plan)).items() if k != "starts"}
    if {k: v for k, v in old.plan.items() if k != "starts"} != same_plan:
        raise DriverError(f"{path}: another plan ({old.plan}); resume only the same plan, with as many or more starts")
    if starts < old.plan["starts"]:
        raise DriverError(f"{path}: {old.plan['starts']} starts a build planned; --starts may grow, not shrink")
    looked = completed_rounds(old)
    if starts != old.plan["starts"] and looked >= old.plan["min_starts"]:
        raise DriverError(
            f"{path}: judged at {old.plan['min_starts']} starts a build already, so its cap of "
            f"{old.plan['starts']} stays (alpha is split over the looks planned before the first)"
        )
    if old.dataset != mine.dataset:
        raise DriverError(f"{path}: another workload ({old.dataset})")
    labels = {r: b["label"] for r, b in old.builds.items()}
    if labels != {r: b["label"] for r, b in mine.builds.items()} or old.server_args != mine.server_args:
        raise DriverError(f"{path}: another pair of builds or server flags ({labels}, {old.server_args})")
    if old.model != mine.model or (old.model_hash and mine.model_hash and old.model_hash != mine.model_hash):
        raise DriverError(f"{path}: another model ({old.model}, hash {old.model_hash or 'not kept'})")
    for role, b in old.builds.items():
        now = mine.builds[role]
        if (b["python"], b["env"]) != (now["python"], now["env"]):
            log(
                f"[ab] {role} build {b['label']!r} now runs as {now['python']} {now['env']} (was {b['python']} {b['env']})"
            )
    if not old.model_hash:
        log(f"[ab] {path} kept no model hash: the earlier starts' weights are not checked against these")
    if starts > old.plan["starts"]:
        log(f"[ab] the plan grows from {old.plan['starts']} to {starts} starts a build")
