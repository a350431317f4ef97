"""Stand-ins for the A/B driver's server and benchmark call (no vLLM in the unit tier).

``StubServer`` stands for the e2e tier's ``Server`` (same constructor and attributes) and
``StubBench`` for ``run_bench_subprocess`` (it parses the same ``vllm bench serve`` arguments and
returns a result dict with the keys vLLM's ``main(args)`` returns). A test module that uses them
imports ``reset_stubs`` too (an autouse fixture: each test starts with no server started).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import pytest

from moegate.ab.driver import Driver
from moegate.ab.plan import BenchError, Dataset, Plan


def build(label: str) -> SimpleNamespace:
    return SimpleNamespace(label=label, python=sys.executable, env={}, server_args=())


class ServerError(RuntimeError):
    pass


class StubServer:
    """Stands for moegate.serve.server.Server: one 'process' per ``with``."""

    started: ClassVar[list[str]] = []
    fail_on: ClassVar[set[int]] = set()  # start numbers (0-based, in order) that fail to come up
    die_on: ClassVar[set[int]] = set()  # start numbers whose process is dead after a bench error

    def __init__(self, build, model, args=(), *, log_path, startup_timeout_s=900, served_name=None):
        self.build, self.model, self.args, self.log_path = build, model, list(args), Path(log_path)
        self.number = len(StubServer.started)
        StubServer.started.append(build.label)

    def __enter__(self):
        self.log_path.write_text(f"server {self.number} of {self.build.label}\nline two\n")
        if self.number in StubServer.fail_on:
            raise ServerError(f"server exited during startup\n{self.log_tail()}")
        self.port = 8000 + self.number
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_name = "served-" + Path(self.model).name
        return self

    def __exit__(self, *exc):
        return False

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-n:])

    def check_alive(self) -> None:
        if self.number in StubServer.die_on:
            raise ServerError("process exited with code -9")


class StubBench:
    """Stands for run_bench_subprocess: parses the bench args, writes and returns a result dict shaped like
    vLLM's with ``--save-detailed``: every request's latency, first-token time and output length, and the
    ``median_tpot_ms`` vLLM computes from them."""

    def __init__(self, tok_s, fail=None, failed_requests=None, decode=None):
        self.tok_s = tok_s  # (label, c, start seed) -> tok/s
        self.decode = decode or decode_ms  # (label, c, server number) -> decode ms a token of that start
        self.fail = fail or set()  # (call number) -> raise BenchError
        self.failed_requests = failed_requests or set()
        self.calls: list[dict] = []
        self.prestarted: list[tuple[str, int]] = []  # (build, servers started by then)

    def prestart(self, build):
        self.prestarted.append((build.label, len(StubServer.started)))

    def __call__(self, build, args, json_out, log_path):
        opt = {}
        for i, a in enumerate(args):
            if a.startswith("--"):
                nxt = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else True
                opt[a[2:]] = nxt
        n = len(self.calls)
        self.calls.append({"label": build.label, "args": list(args), "opt": opt, "json": json_out})
        log_path.write_text(f"bench call {n}\n")
        if n in self.fail:
            raise BenchError(f"benchmark exited 1; {log_path}:\nTraceback: boom")
        c, prompts = int(opt["max-concurrency"]), int(opt["num-prompts"])
        out_len = int(str(opt.get("random-output-len") or opt.get("sharegpt-output-len")))
        server = int(str(opt["base-url"]).rsplit(":", 1)[1]) - 8000
        step = self.decode(build.label, c, server) / 1000.0
        failed = 1 if n in self.failed_requests else 0
        ttfts = [0.05 + 0.001 * i for i in range(prompts - failed)] + [0.0] * failed
        # requests differ a little, as requests of one run do (+-1 % about the start's decode time)
        latencies = [t + (out_len - 1) * step * (1 + 0.01 * ((i * 3) % 5 - 2) / 2) for i, t in enumerate(ttfts)]
        lens = [out_len] * (prompts - failed) + [0] * failed
        latencies = latencies[: prompts - failed] + [0.0] * failed
        tpots = [1000 * (lat - t) / (k - 1) for lat, t, k in zip(latencies, ttfts, lens) if k > 1]
        result = {
            "completed": prompts - failed,
            "failed": failed,
            "duration": 2.5,
            "output_throughput": self.tok_s(build.label, c, int(opt["seed"])),
            "errors": [""] * (prompts - failed) + ["HTTP 500"] * failed,
            "latencies": latencies,
            "ttfts": ttfts,
            "output_lens": lens,
            "median_tpot_ms": statistics.median(tpots) if tpots else 0.0,
        }
        json_out.write_text(json.dumps(result))
        return result


@pytest.fixture(autouse=True)
def reset_stubs():
    StubServer.started, StubServer.fail_on, StubServer.die_on = [], set(), set()
    yield


def decode_ms(label, c, server):
    """A start's decode time a token: 10 ms at every level, a start-to-start spread of about 0.5 % (by server
    number), the PR 20 % faster at 2 and 4 in flight: *improved* there and *equivalent* at 1 by 3 starts."""
    jitter = 1.0 + 0.005 * ((server * 3) % 5 - 2) / 2
    return 10.0 * jitter * (1 / 1.2 if label == "pr" and c in (2, 4) else 1.0)


def tok_s(label, c, seed):
    base = 10.0 * c
    jitter = 1.0 + 0.002 * (seed % 7)
    return base * jitter * (1.10 if label == "pr" and c in (2, 4) else 1.0)


def make_driver(tmp_path, bench, *, starts=3, levels=(1, 2, 4), dataset=None, **plan):
    return Driver(
        {"base": build("base"), "pr": build("pr")},
        tmp_path / "model",
        tmp_path / "run",
        Plan(concurrency=levels, starts=starts, output_len=16, target_seconds=0.5, **plan),
        dataset or Dataset("random", input_len=32),
        server_factory=StubServer,
        bench=bench,
        log=lambda msg: None,
    )


def set_result_fields(run_dir, run, levels, values, default):
    """Write vLLM-shaped statistics into each good start's ``measured-c<c>.json`` of a driver-written run:
    ``values[(start index, c)]`` is a dict of fields, ``default`` the fields of every other run."""
    for s in run.starts:
        for c in levels:
            path = run_dir / s.folder / f"measured-c{c}.json"
            raw = json.loads(path.read_text())
            raw.update(values.get((s.index, c), default))
            path.write_text(json.dumps(raw))
    return run
