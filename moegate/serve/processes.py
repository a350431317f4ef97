"""Processes moegate starts and must stop, with nothing left behind: the one place for liveness and killing.

Two kinds. A server or an lm-eval run starts in a session of its own
(``start_new_session=True``), so its process group is everything it started:
``group_alive`` and ``stop_group`` act on the group. cosmic-ray starts each test run
in a new session, so a group cannot reach them: the tree below a pid is read from
``/proc`` and each pid in it is killed by number (``stop_tree``). ``log_tail`` reads
the end of a process's log for the one-line errors. ``stop_left_behind`` stops a server
an earlier, killed driver left running, from the group id it recorded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from moegate.dispatch.names import API_SERVER


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


def cmdline(pid: int) -> list[str]:
    """``pid``'s argv from ``/proc`` (empty for a zombie, a kernel thread or a pid that is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def stop_left_behind(pgid_file: Path, marker: str = API_SERVER, wait_s: float = 10.0) -> int | None:
    """SIGKILL the process group recorded in ``pgid_file`` if it is still the server that was recorded; the pgid
    killed, or None.

    A driver killed mid-stop (``timeout -k``'s KILL) leaves its server running in a session of its own, holding
    the GPU, and the next start fails for lack of memory. The file is removed, whether a group was killed or the
    record was stale (a dead group, another command line, not a pgid at all). The group is the recorded
    server when its leader (pid = pgid) is alive and ``marker`` is one of its arguments (a recycled pid leads a
    group of its own with another command line), or when the leader is gone but the group still has members:
    the kernel does not hand out a pid again while a process group still bears it, so those members are what is
    left of the recorded server (an engine core whose API server exited)."""
    try:
        pgid = int(pgid_file.read_text().strip())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        pgid = 0
    if pgid <= 1:
        with contextlib.suppress(OSError):
            pgid_file.unlink()
        return None
    try:
        os.killpg(pgid, 0)
        members = group_members(pgid)
    except (ProcessLookupError, PermissionError):  # gone, or another user's group on a recycled pid
        members = set()
    ours = bool(members) and (pgid not in members or any(marker in a for a in cmdline(pgid)))
    if ours:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        end = time.monotonic() + wait_s
        while group_alive(pgid) and time.monotonic() < end:
            time.sleep(0.1)
    with contextlib.suppress(OSError):
        pgid_file.unlink()
    return pgid if ours else None


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
