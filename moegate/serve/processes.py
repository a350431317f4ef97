"""Process trees, by pid: cosmic-ray starts each test run in a new session, so a process group cannot reach it.

Stopping a run must stop every test run it started (a mutant may hang), and
nothing else, so the tree below a pid is read from ``/proc`` and each pid in it is
killed by number.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendants(pid: int) -> list[int]:
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


def stop_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` and everything it started, by pid."""
    if proc.poll() is not None:
        return
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
