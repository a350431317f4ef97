"""Processes moegate starts and must stop, with nothing left behind: the one place for liveness and killing.

Two kinds. A server or an lm-eval run starts in a session of its own
(``start_new_session=True``), so its process group is everything it started:
``group_alive`` and ``stop_group`` act on the group. cosmic-ray starts each test run
in a new session, so a group cannot reach them: the tree below a pid is read from
``/proc`` and each pid in it is killed by number (``stop_tree``). ``log_tail`` reads
the end of a process's log for the one-line errors.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> set[int]:
    """The pids of process group ``pgid`` that are not zombies, read from ``/proc``."""
    members = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.add(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a member that is not a zombie (a group of zombies only is gone)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_members(pgid))


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """SIGTERM to ``proc``'s group (it leads one: ``start_new_session``), SIGKILL after ``grace_s``; reaped."""
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (proc.poll() is None or group_alive(pgid)):
        time.sleep(0.2)
    if proc.poll() is None or group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    end = time.monotonic() + 10
    while group_alive(pgid) and time.monotonic() < end:
        time.sleep(0.2)


def log_tail(path: Path, n: int = 30, missing: str = "(no log)") -> str:
    """The last ``n`` lines of the log at ``path``; ``missing`` where it cannot be read."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return missing


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
