"""A server of a build that is already running: the run uses it, never starts or stops it.

``python -m moegate.e2e run --base=PY --base-url=URL`` (or ``--pr-url``): where one server
start is the cost (minutes for a large model on a GPU runner, most of the CPU smoke's time),
several checks can share one start, each naming the build the server belongs to. The run
cannot see how it was started, so it checks what it can before trusting it, and refuses
with one line otherwise:

- it answers ``/health``;
- ``/version`` is the vLLM release the build's own interpreter imports (``Build.describe``);
- ``/v1/models`` serves the model the run was given (its ``root``, the path or hub name).

The flags are the caller's word: the goldens are keyed by ``--server-args`` and the build's
own flags, which must be those the server was started with. A server that dies while the
run uses it fails the run as an owned one does, but its log is wherever it was started.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from moegate.serve.build import Build
from moegate.serve.server import ServerError, resolve_model


def _get(url: str, timeout_s: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # loopback or the runner's own network
        return json.loads(resp.read().decode() or "null")


class AttachedServer:
    """The ``Server`` interface the gates use (``url``, ``model_name``, ``check_alive``, ``log_tail``) over a
    server started elsewhere; ``start`` checks it is the build's and the model's, ``stop`` leaves it running."""

    def __init__(self, build: Build, model: str | os.PathLike[str], url: str, *, vllm_version: str | None) -> None:
        self.build = build
        self.model = resolve_model(model)
        self.url = url.rstrip("/")
        self.vllm_version = vllm_version
        self.model_name = ""
        self.started_s: float | None = None  # not started here: the report says "attached"

    def _fail(self, what: str) -> ServerError:
        return ServerError(f"server of build {self.build.label} at {self.url}: {what}")

    def start(self) -> None:
        try:
            _get(self.url + "/health")
            version = (_get(self.url + "/version") or {}).get("version")
            models = (_get(self.url + "/v1/models") or {}).get("data") or []
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError) as exc:
            raise self._fail(f"does not answer ({exc})") from None
        if self.vllm_version is not None and version != self.vllm_version:
            raise self._fail(f"serves vLLM {version}, but the build's interpreter imports vLLM {self.vllm_version}")
        roots = {str(m.get("root") or m.get("id")): str(m.get("id")) for m in models if isinstance(m, dict)}
        want = {self.model, str(Path(self.model).resolve())}
        found = [name for root, name in roots.items() if root in want or str(Path(root).resolve()) in want]
        if not found:
            raise self._fail(f"serves {', '.join(sorted(roots)) or 'no model'}, not {self.model}")
        self.model_name = found[0]

    def log_tail(self, n: int = 40) -> str:
        return f"(started outside this run: its log is where it was started; {n} lines not available here)"

    def check_alive(self, grace_s: float = 0.0) -> None:
        """Raise ``ServerError`` unless ``/health`` answers within ``grace_s`` (at least one try)."""
        deadline = time.monotonic() + grace_s
        while True:
            try:
                _get(self.url + "/health", timeout_s=5)
                return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
                if time.monotonic() >= deadline:
                    raise self._fail("died (no answer on /health)") from None
                time.sleep(0.5)

    def stop(self) -> None:
        """Nothing: whoever started it stops it."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
