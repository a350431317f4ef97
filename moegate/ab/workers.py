"""The benchmark workers: one long-lived ``python -m moegate.builds.bench_serve --worker`` per build, spoken to in JSON lines over its pipes."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import threading
from pathlib import Path

from moegate.ab.plan import BenchError, BuildLike, safe_label
from moegate.paths import ROOT
from moegate.serve.processes import log_tail


class BenchWorkers:
    """One long-lived ``moegate.builds.bench_serve --worker`` per build: vLLM is imported once per build.

    A fresh process per level paid vLLM's import (on the H200: ``results/ab-h200-attempt.md``) ten
    times per server start, more than the measurement itself. The worker only runs the benchmark
    client; every server start is still fresh. Each run's slice of the worker's log is
    copied to that run's log file, so a failed run shows its own tail.
    """

    def __init__(self, folder: Path, timeout_s: float = 3600.0) -> None:
        self.folder, self.timeout_s = Path(folder), timeout_s
        self.procs: dict[str, tuple[subprocess.Popen[str], Path, queue.Queue[str]]] = {}
        self.starting: set[str] = set()  # spawned, ready line not read yet

    def _start(self, build: BuildLike) -> tuple[subprocess.Popen[str], Path, queue.Queue[str]]:
        env = {**os.environ, **dict(build.env)}
        log = self.folder / f"bench-worker-{safe_label(build.label)}.log"
        self.folder.mkdir(parents=True, exist_ok=True)
        fh = log.open("a")
        proc = subprocess.Popen(
            [build.python, "-m", "moegate.builds.bench_serve", "--worker"],
            env=env,
            cwd=ROOT,  # moegate imports there: installed in the build's env, or from the checkout (``-m``)
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=fh,
            text=True,
        )
        replies: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                replies.put(line)
            replies.put("")  # EOF: the worker is gone

        threading.Thread(target=pump, daemon=True).start()
        self.procs[build.label] = (proc, log, replies)
        self.starting.add(build.label)
        return self.procs[build.label]

    def prestart(self, build: BuildLike) -> None:
        """Spawn the build's worker now and return at once; its first run waits for it to be ready.
        The driver calls this before the first server start, so vLLM's import in the worker (about
        27 s a build on the H200) runs while the server comes up instead of after it."""
        if build.label not in self.procs:
            self._start(build)

    def _answer(self, build: BuildLike, log: Path, replies: queue.Queue[str], what: str) -> dict:
        try:
            line = replies.get(timeout=self.timeout_s)
        except queue.Empty:
            self.close(build.label)
            raise BenchError(
                f"{what}: no answer in {self.timeout_s:.0f} s; {log}:\n{log_tail(log, missing='')}"
            ) from None
        if not line:
            self.procs.pop(build.label, None)
            self.starting.discard(build.label)
            raise BenchError(
                f"{what}: the benchmark worker of {build.label} exited; {log}:\n{log_tail(log, missing='')}"
            )
        answer: dict = json.loads(line)
        return answer

    def __call__(self, build: BuildLike, args: list[str], json_out: Path, log_path: Path) -> dict:
        proc, log, replies = self.procs.get(build.label) or self._start(build)
        if build.label in self.starting:
            self._answer(build, log, replies, what="worker start")
            self.starting.discard(build.label)
        start = log.stat().st_size if log.exists() else 0
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"args": args, "json_out": str(json_out)}) + "\n")
        proc.stdin.flush()
        answer = self._answer(build, log, replies, what="benchmark")
        with log.open("rb") as src:
            src.seek(start)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.write_bytes(f"# worker {log.name}, this run's part\n".encode() + src.read())
        if not answer.get("ok") or not json_out.is_file():
            raise BenchError(f"benchmark failed: {answer.get('error')}; {log_path}:\n{log_tail(log_path, missing='')}")
        return json.loads(json_out.read_text())

    def close(self, label: str | None = None) -> None:
        for key in [label] if label else list(self.procs):
            entry = self.procs.pop(key, None)
            self.starting.discard(key)
            if entry is None:
                continue
            proc = entry[0]
            with contextlib.suppress(Exception):
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()
