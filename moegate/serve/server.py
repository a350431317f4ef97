"""One real vLLM OpenAI server, started from a build's own Python and always torn down.

Modelled on what vLLM's own test helper (``RemoteOpenAIServer``) does, written anew:
the server runs as ``python -m vllm.entrypoints.openai.api_server`` (the CPU build's
``vllm`` command is broken, the module works for every release) on a free loopback
port, in a process group of its own so that its engine-core child goes with it;
``/health`` is polled until it answers; the whole log is kept in a file; on exit the
group gets SIGTERM, then SIGKILL, and on a GPU the runner waits until the group's processes hold no device
memory, so the next start measures what it should. While the server runs, its pgid is kept in a file beside
its log (``server.log`` -> ``server.pgid``), so that a later run can stop a server whose driver was killed
before it could (``moegate.serve.processes.stop_left_behind``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from moegate.dispatch.names import API_SERVER as SERVER_MODULE
from moegate.serve.build import Build
from moegate.serve.processes import group_alive, group_members, stop_group

QUIET_ENV = {
    # nothing may be fetched at run time, and nothing phoned home
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}


TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

TERMINATING_GRACE_S = 2.0
"""SIGTERM to SIGKILL of a server's group once the driver itself is being terminated (``stop_timeout_s`` otherwise).

Whoever sent the driver its SIGTERM may send SIGKILL seconds later (``timeout -k``: 10 s in our scripts until
2026-12-03), and a driver killed mid-stop leaves its server running, out of reach of any signal to the driver's
group. vLLM's server took longer than those 10 s to go on the H200, so a terminated driver does not wait for it
to go by itself."""

_terminating = threading.Event()
"""Set by ``teardown_on_termination``'s handler: this process is ending, a stop must be quick."""


def terminating() -> bool:
    """Whether a SIGTERM or SIGHUP has reached this process inside ``teardown_on_termination``."""
    return _terminating.is_set()


def stop_grace_s(stop_timeout_s: float) -> float:
    """SIGTERM to SIGKILL for a server stopped now: ``TERMINATING_GRACE_S`` at most while the process is ending."""
    return min(stop_timeout_s, TERMINATING_GRACE_S) if terminating() else stop_timeout_s


def pgid_path(log_path: Path) -> Path:
    """Where a server logging to ``log_path`` keeps its pgid while it runs: ``server.log`` -> ``server.pgid``."""
    return Path(log_path).with_suffix(".pgid")


@contextlib.contextmanager
def teardown_on_termination() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` so every ``Server`` is stopped.

    A server runs in a process group of its own (its engine core must go with it), so a
    signal sent to the driver's group never reaches it, and Python's default action for
    SIGTERM skips every ``finally``. Without this, ``timeout``, a cancelled CI job or a
    plain ``kill`` leaves a server holding the GPU, and the next start on that machine
    fails: seen on the H200, where a timed-out A/B call left one behind and the next two
    starts failed in engine start-up. SIGINT already raises ``KeyboardInterrupt``.
    The signal also marks the process as ending (``terminating``): ``Server.stop`` is then quick, since whoever
    sent it may kill the driver soon after. The mark stays: the process is on its way out.
    Only the main thread can install handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, _frame: object) -> None:
        _terminating.set()
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, _exit) for sig in TERMINATING_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class ServerError(RuntimeError):
    """The server did not start, died or timed out; the message ends with its last log lines."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def hf_cache_dirs() -> list[Path]:
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    dirs = [Path(os.environ["HF_HUB_CACHE"])] if os.environ.get("HF_HUB_CACHE") else []
    return [*dirs, home / "hub"]


def resolve_model(model: str | os.PathLike[str]) -> str:
    """A model directory, or a hub name found in the local cache; anything else is one clear line.

    The gate runs offline: a hub name that is not in the cache is an error, not a download.
    """
    text = str(model)
    path = Path(text).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ServerError(f"model {text}: a path, but no config.json in it")
        return str(path.resolve())
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        folder = "models--" + text.replace("/", "--")
        for cache in hf_cache_dirs():
            snaps = cache / folder / "snapshots"
            if snaps.is_dir() and any(snaps.iterdir()):
                return text
        where = ", ".join(str(c) for c in hf_cache_dirs())
        raise ServerError(f"model {text} is not in the local Hugging Face cache ({where}); the gate runs offline")
    raise ServerError(f"model {text}: no such directory")


def gpu_pids() -> set[int] | None:
    """The pids holding memory on any GPU (nvidia-smi's compute apps), or None without nvidia-smi.

    In a container whose pid namespace the driver does not see, the list can be empty: the wait below then ends
    at once, after the group is already reaped."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-compute-apps=pid", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        return {int(v) for v in out.split() if v.strip().isdigit()}
    except (OSError, subprocess.TimeoutExpired):
        return None


def wait_gpu_released(pids: set[int], timeout_s: float, poll_s: float = 1.0) -> None:
    """Until none of ``pids`` holds GPU memory, at most ``timeout_s``.

    Only the stopped server's own processes are waited for: the GPU's total memory is not, since other work on it
    (the pair's other servers, another leg beside this one) keeps it up; on the H200 rehearsal of 2026-12-02 a
    wait for the total to fall back ran its whole 120 s for each of an e2e leg's three servers, about 4 of its 9
    minutes."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        held = gpu_pids()
        if held is None or not held & pids:
            return
        time.sleep(poll_s)


class Server:
    """``with Server(build, model, args, log_path=...) as srv:`` — a fresh server per ``with``."""

    def __init__(
        self,
        build: Build,
        model: str | os.PathLike[str],
        args: Sequence[str] = (),
        *,
        log_path: Path,
        startup_timeout_s: float = 900,
        served_name: str | None = None,
        port: int | None = None,
        stop_timeout_s: float = 30,
        gpu_release_timeout_s: float = 120,
    ) -> None:
        self.build = build
        self.model = resolve_model(model)
        self.args = tuple(args)
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.model_name = served_name or "moegate-model"
        if port is not None and port_in_use(port):
            raise ServerError(f"port {port} on 127.0.0.1 is in use")
        self._fixed_port = port
        self.port = 0
        self.url = ""
        self.stop_timeout_s = stop_timeout_s
        self.gpu_release_timeout_s = gpu_release_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None

    # --- the command -----------------------------------------------------------

    def argv(self) -> list[str]:
        return [
            self.build.python, "-m", SERVER_MODULE,
            "--model", self.model,
            "--served-model-name", self.model_name,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            *self.args,
            *self.build.server_args,  # last: a build's own flags override the common ones
        ]  # fmt: skip

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def error_lines(self, n: int = 6) -> list[str]:
        """The log's first error lines: vLLM's root cause usually sits far above the last traceback."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        hits = [
            ln for ln in lines if " ERROR " in ln or ln.lstrip().startswith(("ValueError", "RuntimeError", "OSError"))
        ]
        return hits[:n]

    def _fail(self, what: str) -> ServerError:
        causes = self.error_lines()
        cause = ("\nfirst error lines:\n" + "\n".join(causes)) if causes else ""
        return ServerError(f"{what}; server log {self.log_path}{cause}\nlast lines:\n{self.log_tail()}")

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        self.port = self._fixed_port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**self.build.environ(), **QUIET_ENV}
        with open(self.log_path, "ab") as log:
            log.write(f"# moegate: {' '.join(self.argv())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(  # the build's own interpreter, our own argv
                self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )  # fmt: skip
        self.pgid_path.write_text(f"{self.proc.pid}\n")  # it leads its group; removed once a stop saw it go
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise self._fail(
                    f"server of build {self.build.label} exited with {self.proc.returncode} while starting"
                )
            if self._healthy():
                self.started_s = time.monotonic() - t0
                return
            if time.monotonic() > deadline:
                raise self._fail(f"server of build {self.build.label} not healthy after {self.startup_timeout_s:.0f} s")
            time.sleep(1.0)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:  # loopback
                return bool(resp.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def check_alive(self, grace_s: float = 0.0) -> None:
        """Raise ``ServerError`` (with the log) if the server has died, waiting up to ``grace_s`` for it.

        The grace is for callers that just lost a connection: the socket closes a moment
        before the process can be reaped, and the dead server is the error worth reporting.
        """
        deadline = time.monotonic() + grace_s
        while self.proc is not None and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise self._fail(f"server of build {self.build.label} died (exit {code})")

    @property
    def pgid_path(self) -> Path:
        return pgid_path(self.log_path)

    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL after ``stop_timeout_s``; then wait until its processes leave the GPU.

        While the process is ending (``terminating``) the grace is ``TERMINATING_GRACE_S`` and there is no wait for
        the GPU: the group is already reaped by then, no start follows in this process, and the caller's SIGKILL
        may be near; a signal that ends the process in the middle of a normal stop makes it quick the same way.
        The pgid file goes once the group is gone."""
        proc = self.proc
        if proc is None:
            return
        members = group_members(proc.pid) | {proc.pid}
        try:
            stop_group(proc, stop_grace_s(self.stop_timeout_s))
            if not terminating():
                wait_gpu_released(members, self.gpu_release_timeout_s)
        except BaseException:  # SystemExit from teardown_on_termination, or Ctrl-C, mid-stop: finish it quickly
            stop_group(proc, TERMINATING_GRACE_S)
            raise
        finally:
            if not group_alive(proc.pid):
                self.pgid_path.unlink(missing_ok=True)
            self.proc = None

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
