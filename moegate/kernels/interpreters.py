"""Worker processes in another interpreter: a build's, spawned by this process for the differential kernel tier.

A build is an interpreter (``moegate.builds.planted``): its own site-packages, its vLLM, perhaps a planted bug
imported at its start. The differential tier runs one pool of kernel workers (``moegate.kernels.workers``) in
the base's interpreter and one in the PR's, fed by one parent. Python's ``multiprocessing`` can spawn a child
in another executable (``set_executable``), but it hands the child the parent's ``sys.path`` and ``__main__``,
which would shadow the build's own packages with the parent's; ``spawning_in`` gives the child its own path
instead, behind the checkout this moegate imports from, so both sides run one moegate and each its own vLLM.
Both interpreters must be the same Python (major.minor): the queues pickle between them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from multiprocessing import spawn
from pathlib import Path
from typing import Any

import moegate


class InterpreterError(RuntimeError):
    """An interpreter that cannot be asked for its path: one line."""


_ABOVE = Path(moegate.__file__).resolve().parent.parent
CODE_ROOT = str(_ABOVE) if (_ABOVE / "pyproject.toml").is_file() else None
"""The checkout this process imports moegate from: first on a foreign worker's path, so both sides run one moegate.
None where moegate is installed (its folder is a site-packages, whose other packages must not shadow the build's):
the worker then imports the moegate its build has."""


@cache
def _own_path(python: str) -> tuple[str, ...]:
    """``python``'s own ``sys.path`` as it starts here (its site-packages, its build's sites), without ``-c``'s ''."""
    code = "import json, sys; print(json.dumps(sys.path[1:]))"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False, cwd="/")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise InterpreterError(f"{python}: cannot start it to read its sys.path ({last})")
    return tuple(json.loads(proc.stdout))


@contextmanager
def spawning_in(python: str | None) -> Iterator[None]:
    """Processes started inside this block run in ``python`` (None: this interpreter, as always).

    multiprocessing's spawn starts the child with one executable for the whole module and hands it the
    parent's ``sys.path`` and ``__main__``: a build's own packages (its vLLM, its planted bug) would be
    shadowed by the parent's. So, while the block's processes start, the executable is ``python``, the
    child's path is its own (``_own_path``) behind ``CODE_ROOT``, and it imports no ``__main__`` of the
    parent's (the worker's target and runner are named by module). Both are put back after.
    """
    if python is None:
        yield
        return
    child_path = ([CODE_ROOT] if CODE_ROOT else []) + [p for p in _own_path(python) if p != CODE_ROOT]
    prepare, executable = spawn.get_preparation_data, spawn.get_executable()

    def preparation(name: str) -> dict[str, Any]:
        data: dict[str, Any] = prepare(name)
        data["sys_path"] = list(child_path)
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
        return data

    spawn.set_executable(python)
    setattr(spawn, "get_preparation_data", preparation)  # noqa: B010 - popen_spawn_posix looks it up per start
    try:
        yield
    finally:
        setattr(spawn, "get_preparation_data", prepare)  # noqa: B010
        spawn.set_executable(executable)
