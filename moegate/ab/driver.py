"""The A/B driver: interleaved server starts of two builds, a warm-up and a measured sweep per start.

Schedule. Builds A (base) and B (PR) start in rounds, ``A B | B A | A B | ...`` (round
``r`` puts A first when ``r`` is even), ``starts`` rounds, so drift over the run and the
order inside a round hit both builds alike. Every start is a fresh server process (the
e2e tier's ``Server``), so no start inherits another's caches in memory; compilations
cached on disk are warmed by the warm-up sweep of every start anyway.

Per start:

1. **Warm-up sweep, not counted**: every concurrency once, in the measured order,
   ``warmup_rounds x c`` prompts with ``--num-warmups c``, so every kernel variant the
   measured sweep will hit (naive and sorted, each tile config) is compiled and the
   server's first-request costs are paid before anything is timed.
2. **Measured sweep**: per concurrency ``c``, ``vllm bench serve`` (in-process, in the
   build's own Python, ``moegate/vllm/bench_serve.py``) with ``--max-concurrency c``,
   ``--num-warmups c``, ``--ignore-eos``, a fixed output length, and ``N_c`` prompts.
   ``N_c`` is sized by time, once, from the warm-up throughput ``T_c`` (output tok/s) of
   the first start whose warm-up sweep completed: ``N_c = c x max(min_rounds, ceil(target_seconds x T_c /
   (output_len x c)))``, then fixed for every later start of both builds, so both builds
   serve the same workload. The warm-up pays the compilations, so ``T_c`` is usually an
   underestimate and a level runs somewhat shorter than ``target_seconds``; each level's
   measured duration is kept and reported. ``min_rounds`` is the floor.
3. **Seeds**: round ``r``, level index ``j``: ``seed + 1000 r + j`` for the measured run
   and ``seed + 1000 r + 500 + j`` for its warm-up. Both builds of a round get the same
   prompts (a paired workload); within one server, every run draws its prompts with a seed
   no other run of that server used, so a level does not replay an earlier pass's prompt
   set out of the prefix cache (vLLM's ``--num-warmups`` requests repeat the level's first
   prompt, which can then hit the cache once; the same for both builds).

Failures. A server that does not come up, a benchmark that exits non-zero, or a run with
failed requests (or fewer completed than sent) marks the whole start **failed**: its log
tail is kept in ``run.json`` and the report, none of its levels is counted (nothing is
averaged over a failed start), and the remaining starts go on. The verdict says how many
good starts it rests on per build.

Every raw result JSON (``starts/<k>-<label>/{warmup,measured}-c<c>.json``), each bench
and server log, and ``run.json`` (config, schedule, sizing, per-start status and samples)
stay in the run's folder; ``report.md`` / ``throughput.png`` are written from them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from moegate.core import progress
from moegate.paths import ROOT

DEFAULT_CONCURRENCY = (1, 2, 3, 4, 8, 16)
ROLES = ("base", "pr")


class DriverError(RuntimeError):
    """Bad input to the driver: one line, raised before any server starts."""


class BenchError(RuntimeError):
    """A benchmark run failed; the message ends with its log's last lines."""


class BuildLike(Protocol):
    """What the driver reads of a build (read-only: moegate.serve.build.Build is frozen)."""

    @property
    def label(self) -> str: ...
    @property
    def python(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def server_args(self) -> tuple[str, ...]: ...


class ServerLike(Protocol):
    url: str
    model_name: str

    def log_tail(self, n: int = 40) -> str: ...
    def check_alive(self) -> None: ...


ServerFactory = Callable[..., AbstractContextManager[ServerLike]]
BenchFn = Callable[[BuildLike, list[str], Path, Path], dict]


@dataclass(frozen=True)
class Dataset:
    """``sharegpt`` with a path to a valid ShareGPT JSON list, or ``random`` with stated lengths."""

    name: str
    path: str | None = None
    input_len: int | None = None

    def __post_init__(self) -> None:
        if self.name == "sharegpt" and not self.path:
            raise DriverError("the sharegpt dataset needs --dataset-path FILE (a ShareGPT JSON list)")
        if self.name == "random" and not self.input_len:
            raise DriverError("the random dataset needs --random-input-len N")
        if self.name not in ("sharegpt", "random"):
            raise DriverError(f"unknown dataset {self.name!r}: sharegpt or random")

    def bench_args(self, output_len: int) -> list[str]:
        if self.name == "sharegpt":
            return [
                "--dataset-name",
                "sharegpt",
                "--dataset-path",
                str(self.path),
                "--sharegpt-output-len",
                str(output_len),
            ]
        return [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(self.input_len),
            "--random-output-len",
            str(output_len),
        ]

    def describe(self, output_len: int) -> str:
        if self.name == "sharegpt":
            return f"ShareGPT records from {self.path}, {output_len} output tokens each (--ignore-eos)"
        return f"random token prompts of {self.input_len} tokens, {output_len} output tokens each (--ignore-eos)"


def sharegpt_records(path: str | Path) -> int:
    """Records vLLM's ShareGPT loader can use (a conversation of 2+ turns), or one-line DriverError."""
    p = Path(path)
    if not p.is_file():
        raise DriverError(f"--dataset-path {p}: no such file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DriverError(
            f"--dataset-path {p}: not valid JSON ({exc}); a truncated dump needs a streaming "
            "parse written back as a list (moegate/e2e/prompts.py)"
        ) from None
    if not isinstance(data, list):
        raise DriverError(f"--dataset-path {p}: expected a JSON list of ShareGPT records")
    return sum(1 for r in data if isinstance(r, dict) and len(r.get("conversations") or ()) >= 2)


@dataclass(frozen=True)
class Plan:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    starts: int = 3  # per build
    output_len: int = 128
    target_seconds: float = 30.0
    min_rounds: int = 4
    warmup_rounds: int = 2
    seed: int = 1
    prompts: Mapping[int, int] | None = None  # fixed N_c instead of sizing by time
    extra_bench_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise DriverError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if self.starts < 1:
            raise DriverError(f"starts={self.starts}: need at least 1 (2 for a verdict)")
        if self.output_len < 1 or self.min_rounds < 1 or self.warmup_rounds < 1 or self.target_seconds <= 0:
            raise DriverError("output_len, min_rounds, warmup_rounds must be >= 1 and target_seconds > 0")

    def size(self, c: int, warm_tok_s: float | None) -> int:
        if self.prompts is not None and c in self.prompts:
            return max(c, self.prompts[c])
        rounds = self.min_rounds
        if warm_tok_s and warm_tok_s > 0:
            rounds = max(rounds, math.ceil(self.target_seconds * warm_tok_s / (self.output_len * c)))
        return c * rounds

    def seeds(self, round_: int, j: int) -> tuple[int, int]:
        """(warm-up seed, measured seed) for round ``round_``, level index ``j``."""
        base = self.seed + 1000 * round_
        return base + 500 + j, base + j


def schedule(starts: int) -> list[tuple[int, str]]:
    """(round, role) in start order: A B | B A | A B ..."""
    out: list[tuple[int, str]] = []
    for r in range(starts):
        out += [(r, "base"), (r, "pr")] if r % 2 == 0 else [(r, "pr"), (r, "base")]
    return out


@dataclass
class StartRecord:
    index: int
    round: int
    role: str
    label: str
    status: str = "pending"  # ok | failed
    error: str | None = None
    log_tail: str | None = None
    warmup: dict[int, float] = field(default_factory=dict)  # tok/s, not counted
    measured: dict[int, float] = field(default_factory=dict)  # tok/s
    durations: dict[int, float] = field(default_factory=dict)  # s, of each measured run
    seconds: float = 0.0
    folder: str = ""


@dataclass
class Run:
    """Everything the report needs, as written to and read back from ``run.json``."""

    builds: dict[str, dict]
    model: str
    server_args: list[str]
    plan: dict
    dataset: str
    prompts: dict[int, int]
    prompts_note: str
    starts: list[StartRecord]

    def samples(self, role: str) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {c: [] for c in self.plan["concurrency"]}
        for s in self.starts:
            if s.role == role and s.status == "ok":
                for c, v in s.measured.items():
                    out.setdefault(c, []).append(v)
        return out

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> Run:
        starts = []
        for s in raw["starts"]:
            s = dict(s)
            s["warmup"] = {int(k): v for k, v in s["warmup"].items()}
            s["measured"] = {int(k): v for k, v in s["measured"].items()}
            s["durations"] = {int(k): v for k, v in s.get("durations", {}).items()}
            starts.append(StartRecord(**s))
        fields = {k: raw[k] for k in ("builds", "model", "server_args", "plan", "dataset", "prompts_note")}
        return cls(**fields, prompts={int(k): v for k, v in raw["prompts"].items()}, starts=starts)


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class BenchWorkers:
    """One long-lived ``moegate.vllm.bench_serve --worker`` per build: vLLM is imported once per build.

    A fresh process per level paid vLLM's import (26-28 s on the H200) ten times per
    server start, more than the measurement itself. The worker only runs the benchmark
    client; every server start is still fresh. Each run's slice of the worker's log is
    copied to that run's log file, so a failed run shows its own tail.
    """

    def __init__(self, folder: Path, timeout_s: float = 3600.0) -> None:
        self.folder, self.timeout_s = Path(folder), timeout_s
        self.procs: dict[str, tuple[subprocess.Popen[str], Path, queue.Queue[str]]] = {}

    def _start(self, build: BuildLike) -> tuple[subprocess.Popen[str], Path, queue.Queue[str]]:
        env = {**os.environ, **dict(build.env)}
        log = self.folder / f"bench-worker-{_safe(build.label)}.log"
        self.folder.mkdir(parents=True, exist_ok=True)
        fh = log.open("a")
        proc = subprocess.Popen(
            [build.python, "-m", "moegate.vllm.bench_serve", "--worker"],
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
        self._answer(build, log, replies, what="worker start")
        return self.procs[build.label]

    def _answer(self, build: BuildLike, log: Path, replies: queue.Queue[str], what: str) -> dict:
        try:
            line = replies.get(timeout=self.timeout_s)
        except queue.Empty:
            self.close(build.label)
            raise BenchError(f"{what}: no answer in {self.timeout_s:.0f} s; {log}:\n{_tail(log)}") from None
        if not line:
            self.procs.pop(build.label, None)
            raise BenchError(f"{what}: the benchmark worker of {build.label} exited; {log}:\n{_tail(log)}")
        answer: dict = json.loads(line)
        return answer

    def __call__(self, build: BuildLike, args: list[str], json_out: Path, log_path: Path) -> dict:
        proc, log, replies = self.procs.get(build.label) or self._start(build)
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
            raise BenchError(f"benchmark failed: {answer.get('error')}; {log_path}:\n{_tail(log_path)}")
        return json.loads(json_out.read_text())

    def close(self, label: str | None = None) -> None:
        for key in [label] if label else list(self.procs):
            entry = self.procs.pop(key, None)
            if entry is None:
                continue
            proc = entry[0]
            with contextlib.suppress(Exception):
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=30)
            if proc.poll() is None:
                proc.kill()


def _default_server_factory() -> ServerFactory:
    try:
        from moegate.serve.server import Server
    except ImportError as exc:
        raise DriverError(f"the e2e tier's server runner is not importable ({exc}): moegate/serve/server.py") from None
    return Server


class Driver:
    """Run the schedule; ``server_factory`` and ``bench`` are injectable (unit tests use stubs)."""

    def __init__(
        self,
        builds: Mapping[str, BuildLike],
        model: str | Path,
        out_dir: Path,
        plan: Plan,
        dataset: Dataset,
        *,
        server_args: Sequence[str] = (),
        tokenizer: str | None = None,
        served_name: str | None = None,
        startup_timeout_s: float = 900.0,
        bench_timeout_s: float = 3600.0,
        server_factory: ServerFactory | None = None,
        bench: BenchFn | None = None,
        log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True),
        resume: bool = False,
        max_new_starts: int | None = None,
    ) -> None:
        if set(builds) != set(ROLES):
            raise DriverError(f"builds must be given for {ROLES}, got {sorted(builds)}")
        self.builds, self.model, self.out_dir, self.plan, self.dataset = (
            builds,
            str(model),
            Path(out_dir),
            plan,
            dataset,
        )
        self.server_args = list(server_args)
        self.tokenizer, self.served_name = tokenizer, served_name
        self.startup_timeout_s = startup_timeout_s
        self.server_factory = server_factory
        self.workers: BenchWorkers | None = None
        if bench is None:
            self.workers = bench = BenchWorkers(Path(out_dir) / "workers", bench_timeout_s)
        self.bench: BenchFn = bench
        self.log = log
        self.records: int | None = None
        self.prompts: dict[int, int] | None = None
        """Prompts per concurrency level, sized from the first start's warm-up (or a resumed run's)."""
        self.prompts_note = "no start came up: nothing sized"
        self.resume, self.max_new_starts = resume, max_new_starts
        """``resume``: continue the schedule of ``out_dir/run.json`` (same plan), keeping its starts and
        its sizing; ``max_new_starts``: stop after that many, so a long schedule can span several
        sessions of a lent machine. The schedule's order, and so the interleaving, is unchanged."""

    # -- checks before any server starts ------------------------------------------------------

    def preflight(self) -> None:
        if self.dataset.name == "sharegpt":
            assert self.dataset.path is not None  # Dataset demands a path for sharegpt
            self.records = sharegpt_records(self.dataset.path)
            need = max(self.plan.concurrency) * self.plan.min_rounds
            if self.records < need:
                raise DriverError(
                    f"--dataset-path {self.dataset.path}: {self.records} usable ShareGPT records (2+ turns), "
                    f"need at least {need} ({self.plan.min_rounds} rounds at concurrency {max(self.plan.concurrency)})"
                )
        for role, b in self.builds.items():
            if not (Path(b.python).exists() or shutil.which(b.python)):
                raise DriverError(f"{role} build {b.label!r}: no interpreter at {b.python}")

    # -- one benchmark run ----------------------------------------------------------------------

    def _bench_args(self, server: ServerLike, c: int, prompts: int, seed: int, label: str) -> list[str]:
        return [
            "--backend",
            "openai",
            "--base-url",
            server.url,
            "--endpoint",
            "/v1/completions",
            "--model",
            self.model,
            "--served-model-name",
            server.model_name,
            "--tokenizer",
            self.tokenizer or self.model,
            *self.dataset.bench_args(self.plan.output_len),
            "--num-prompts",
            str(prompts),
            "--max-concurrency",
            str(c),
            "--num-warmups",
            str(c),
            "--ignore-eos",
            "--seed",
            str(seed),
            "--disable-tqdm",
            "--label",
            label,
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            *self.plan.extra_bench_args,
        ]

    def _one(
        self, build: BuildLike, server: ServerLike, folder: Path, phase: str, c: int, prompts: int, seed: int
    ) -> tuple[float, float]:
        json_out, log_path = folder / f"{phase}-c{c}.json", folder / f"{phase}-c{c}.log"
        args = self._bench_args(server, c, prompts, seed, f"{build.label}-{phase}-c{c}")
        try:
            result = self.bench(build, args, json_out, log_path)
        except BenchError as exc:
            raise BenchError(f"{phase} run at concurrency {c}: {exc}") from None
        completed, failed = int(result.get("completed") or 0), int(result.get("failed") or 0)
        tok_s = result.get("output_throughput")
        if failed or completed < prompts or not (isinstance(tok_s, (int, float)) and tok_s > 0):
            errors = [e for e in result.get("errors") or () if e][:3]
            raise BenchError(
                f"{phase} run at concurrency {c}: {completed} of {prompts} requests completed, {failed} failed, "
                f"output_throughput={tok_s!r}"
                + (f"; first errors: {errors}" if errors else "")
                + f"; {log_path}:\n{_tail(log_path, 10)}"
            )
        return float(tok_s), float(result.get("duration") or 0.0)

    # -- the run --------------------------------------------------------------------------------

    def _sized(self, warm: Mapping[int, float]) -> tuple[dict[int, int], str]:
        prompts = {c: self.plan.size(c, warm.get(c)) for c in self.plan.concurrency}
        note = (
            f"fixed per level ({self.plan.prompts})"
            if self.plan.prompts
            else f"sized once from the first completed warm-up sweep: N_c = c x max({self.plan.min_rounds}, "
            f"ceil({self.plan.target_seconds:g} s x warm-up tok/s / ({self.plan.output_len} x c)))"
        )
        if self.records is not None and max(prompts.values()) > self.records:
            capped = {c: min(n, c * (self.records // c)) for c, n in prompts.items()}
            note += f"; capped to the {self.records} ShareGPT records (no prompt repeated within a level)"
            prompts = capped
        return prompts, note

    def _previous(self) -> list[StartRecord]:
        path = self.out_dir / "run.json"
        if not (self.resume and path.is_file()):
            return []
        old = load_run(self.out_dir)
        if old.plan.get("concurrency") != list(self.plan.concurrency) or old.plan.get("starts") != self.plan.starts:
            raise DriverError(
                f"{path}: another plan ({old.plan.get('concurrency')}, {old.plan.get('starts')} starts); "
                "resume only the same plan"
            )
        if old.prompts:
            self.prompts, self.prompts_note = dict(old.prompts), old.prompts_note
        return list(old.starts)

    def starts(self, done: frozenset[int] = frozenset()) -> Iterator[StartRecord]:
        """Run every start in schedule order (but those in ``done``), yielding each record as it finishes."""
        if not done:
            self.prompts = None
            self.prompts_note = "no start came up: nothing sized"
        factory = self.server_factory or _default_server_factory()
        new = 0
        for index, (round_, role) in enumerate(schedule(self.plan.starts)):
            if index in done:
                continue
            if self.max_new_starts is not None and new >= self.max_new_starts:
                self.log(f"[ab] stopping after {new} new starts (--max-new-starts); resume with --resume")
                return
            new += 1
            build = self.builds[role]
            folder = self.out_dir / "starts" / f"{index:02d}-{role}-{_safe(build.label)}"
            folder.mkdir(parents=True, exist_ok=True)
            rec = StartRecord(index, round_, role, build.label, folder=str(folder.relative_to(self.out_dir)))
            t0 = time.monotonic()
            self.log(f"[ab] start {index + 1}/{2 * self.plan.starts}: {role} ({build.label}), round {round_}")
            server = None
            levels = 2 * len(self.plan.concurrency)  # a warm-up and a measured run per concurrency
            what = f"start {index + 1}/{2 * self.plan.starts}, {role} ({build.label})"
            try:
                with (
                    progress.stage(what, levels, prefix="ab", unit="levels") as bar,
                    factory(
                        build,
                        self.model,
                        self.server_args,
                        log_path=folder / "server.log",
                        startup_timeout_s=self.startup_timeout_s,
                        served_name=self.served_name,
                    ) as server,
                ):
                    for j, c in enumerate(self.plan.concurrency):
                        warm_seed, _ = self.plan.seeds(round_, j)
                        bar.note(f"warm-up, c={c}")
                        rec.warmup[c], _ = self._one(
                            build, server, folder, "warmup", c, c * self.plan.warmup_rounds, warm_seed
                        )
                        bar.advance()
                    if self.prompts is None:
                        self.prompts, self.prompts_note = self._sized(rec.warmup)
                        self.log(f"[ab] prompts per level: {self.prompts}")
                    for j, c in enumerate(self.plan.concurrency):
                        _, seed = self.plan.seeds(round_, j)
                        bar.note(f"measured, c={c}, {self.prompts[c]} prompts")
                        rec.measured[c], rec.durations[c] = self._one(
                            build, server, folder, "measured", c, self.prompts[c], seed
                        )
                        bar.advance()
                        self.log(f"[ab]   c={c}: {rec.measured[c]:.2f} output tok/s")
                rec.status = "ok"
            except Exception as exc:  # noqa: BLE001 - any failure fails this start only, with its reason kept
                rec.status = "failed"
                rec.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                tail = str(exc)
                if server is not None:
                    try:
                        server.check_alive()
                    except Exception as dead:  # noqa: BLE001
                        tail += f"\n-- server died: {dead}"
                    with contextlib.suppress(Exception):  # the tail is a courtesy; the error is already kept
                        tail += "\n-- server log tail:\n" + server.log_tail(30)
                rec.log_tail = tail
                self.log(f"[ab]   start failed: {rec.error}")
            rec.seconds = round(time.monotonic() - t0, 1)
            yield rec

    def run(self) -> Run:
        self.preflight()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prompts = None
        self.prompts_note = "no start came up: nothing sized"
        records: list[StartRecord] = self._previous()
        run = None
        try:
            for rec in self.starts(frozenset(r.index for r in records)):
                records.append(rec)
                run = self._run(records)
                (self.out_dir / "run.json").write_text(json.dumps(run.to_json(), indent=1))  # after every start
        finally:
            if self.workers is not None:
                self.workers.close()
        return run if run is not None else self._run(records)

    def _run(self, records: list[StartRecord]) -> Run:
        builds = {
            role: {"label": b.label, "python": b.python, "server_args": list(b.server_args), "env": dict(b.env)}
            for role, b in self.builds.items()
        }
        plan = asdict(self.plan)
        plan["concurrency"] = list(self.plan.concurrency)
        return Run(
            builds,
            self.model,
            self.server_args,
            plan,
            self.dataset.describe(self.plan.output_len),
            dict(self.prompts or {}),
            self.prompts_note,
            list(records),
        )


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in label)[:40]


def load_run(folder: str | Path) -> Run:
    path = Path(folder) / "run.json"
    if not path.is_file():
        raise DriverError(f"{folder}: no run.json (not an A/B run folder)")
    return Run.from_json(json.loads(path.read_text()))
