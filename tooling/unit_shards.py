"""The unit tier in two shards, so the test command's two lanes can share it (``nox -s "unit-shard(1)"``, ``(2)``).

The unit tier is about half of the test command's work (results/ci-time.md, "The unit tier in two shards"): in one
session it filled a lane alone, and the lane planner (tooling/lanes.py) could not balance the lanes below it. As
two sessions of about half the tier each, the planner packs them like any other session.

Shard 1 runs the rooms named in ``SHARD_1``; shard 2 runs the whole tier with those rooms ignored. So every test runs
in exactly one shard, a room added later lands in shard 2 without an edit here, and a room renamed away fails shard 1
loudly (pytest: "file or directory not found"). ``nox -s unit`` and the hosted unit job still run the whole tier in
one session.
"""

from __future__ import annotations

TIER = "tests/unit"

SHARD_1 = ("kernels", "lab", "serve", "ab", "reach", "offload", "census")
"""Rooms of ``tests/unit`` in shard 1, chosen from one run's per-room seconds to make about half of the tier (the
figures: results/ci-time.md, "The unit tier in two shards")."""

SHARDS = (1, 2)


def pytest_args(shard: int) -> list[str]:
    """pytest's arguments for ``shard``: shard 1 its rooms, shard 2 the tier without them."""
    rooms = [f"{TIER}/{room}" for room in SHARD_1]
    if shard == 1:
        return rooms
    if shard == 2:
        return [TIER, *(f"--ignore={room}" for room in rooms)]
    raise ValueError(f"no unit shard {shard!r}: the shards are {', '.join(map(str, SHARDS))}")
