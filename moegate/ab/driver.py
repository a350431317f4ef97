"""The A/B driver: interleaved server starts of two builds, a warm-up and a measured sweep per start.

Schedule. Builds A (base) and B (PR) start in rounds, ``A B | B A | A B | ...`` (round
``r`` puts A first when ``r`` is even), up to ``starts`` rounds, so drift over the run and the
order inside a round hit both builds alike. Every start is a fresh server process (the
e2e tier's ``Server``), so no start inherits another's caches in memory; compilations
cached on disk are warmed by the warm-up sweep of every start anyway.

Per start:

1. **Warm-up sweep, not counted**: every concurrency once, in the measured order,
   ``warmup_rounds x c`` prompts with ``--num-warmups c``, so every kernel variant the
   measured sweep will hit (naive and sorted, each tile config) is compiled and the
   server's first-request costs are paid before anything is timed.
2. **Measured sweep**: per concurrency ``c``, ``vllm bench serve`` (in-process, in the
   build's own Python, ``moegate/builds/bench_serve.py``) with ``--max-concurrency c``,
   ``--num-warmups c``, ``--ignore-eos``, a fixed output length, and ``N_c`` prompts.
   ``N_c`` is sized by time, once, from the warm-up throughput ``T_c`` (output tok/s) of
   the first start whose warm-up sweep completed: ``N_c = c x max(min_rounds, ceil(target_seconds x T_c /
   (output_len x c)))``, then fixed for every later start of both builds, so both builds
   serve the same workload. The warm-up pays the compilations, so ``T_c`` is usually an
   underestimate and a level runs somewhat shorter than ``target_seconds``; each level's
   measured duration is kept and reported. ``min_rounds`` is the floor.
3. **Seeds**: level index ``j``: ``seed + j`` for the measured run and ``seed + 500 + j`` for its
   warm-up, in every round (``Plan.seeds``): every start of both builds serves the same prompts, so the
   start is the only thing that varies from one start's figures to the next (the decode time responds to
   the prompts: the routing of the sorted path, other requests' prefills). Within one server every run
   draws its prompts with a seed no other run of that server used, so a level does not replay an earlier
   pass's prompt set out of the prefix cache (vLLM's ``--num-warmups`` requests repeat the level's first
   prompt, which can then hit the cache once; the same for both builds). ``vary_prompts`` (the runs
   before the decode-time rule) adds ``1000 r`` in round ``r``.
4. **Per-request figures**: ``--save-detailed`` keeps each request's first-token time, output length and
   inter-token latencies in the result dict, from which ``moegate/ab/latency.py`` takes the decode time a
   token the verdict judges.

Rounds and looks. After each round from ``min_starts`` on, the run is judged (``moegate/ab/verdict.py``,
each look logged); it stops as soon as every level is settled, a build has no good start, or ``starts``
rounds (the cap) have run.

Failures. A server that does not come up, a benchmark that exits non-zero, or a run with
failed requests (or fewer completed than sent) marks the whole start **failed**: its log
tail is kept in ``run.json`` and the report, none of its levels is counted (nothing is
averaged over a failed start), and the remaining starts go on. The verdict says how many
good starts it rests on per build.

Every raw result JSON (``starts/<k>-<label>/{warmup,measured}-c<c>.json``), each bench
and server log, and ``run.json`` (config, schedule, sizing, per-start status and samples)
stay in the run's folder; ``report.md`` / ``throughput.png`` are written from them.

The run as data is ``moegate.ab.plan``; the benchmark processes are ``moegate.ab.workers``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from moegate.ab.plan import (
    ROLES,
    BenchError,
    BenchFn,
    BuildLike,
    Dataset,
    DriverError,
    Plan,
    Run,
    ServerFactory,
    ServerLike,
    StartRecord,
    load_run,
    safe_label,
    schedule,
    sharegpt_records,
)
from moegate.ab.resume import check_same_experiment
from moegate.ab.verdict import completed_rounds, judge
from moegate.ab.workers import BenchWorkers
from moegate.core import progress
from moegate.core.hashing import model_hash
from moegate.serve.processes import log_tail, stop_left_behind
from moegate.serve.server import Server, pgid_path


def _default_server_factory() -> ServerFactory:
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
        self.model_hash = ""
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
        self.model_hash = model_hash(self.model) if Path(self.model).is_dir() else ""

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
            "--save-detailed",  # per-request ttfts, output_lens, itls kept in the result dict: moegate/ab/latency.py
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
                + f"; {log_path}:\n{log_tail(log_path, 10, missing='')}"
            )
        return float(tok_s), float(result.get("duration") or 0.0)

    # -- the run --------------------------------------------------------------------------------

    def _stop_left_behind(self) -> None:
        """Stop any server of this run's start folders still running, before each start: a driver killed mid-stop
        leaves one holding the GPU (the H200, 2026-12-03: the resumed call's four starts all failed for want of
        memory), and so would a stop that failed earlier in this call. A server keeps its pgid beside its log
        (``starts/NN-role-label/server.pgid``) until a stop has seen it go; a few files to read per start."""
        starts = self.out_dir / "starts"
        if not starts.is_dir():
            return
        for folder in sorted(p for p in starts.iterdir() if p.is_dir()):
            pgid = stop_left_behind(pgid_path(folder / "server.log"))
            if pgid is not None:
                self.log(
                    f"[ab] stopped a server left running by an earlier call or a failed stop (pgid {pgid}, start {folder.name})"
                )

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
        """A resumed run's starts, after checking it is the same experiment: the same plan (it may only
        grow by whole rounds: ``schedule(n)`` is a prefix of ``schedule(n + k)``, so the interleaving
        holds), the same workload, the same builds by label, server flags and model (by content where
        both runs kept its hash)."""
        path = self.out_dir / "run.json"
        if not (self.resume and path.is_file()):
            return []
        old = load_run(self.out_dir)
        check_same_experiment(path, old, self._run([]), self.plan.starts, self.log)
        if old.prompts:
            self.prompts, self.prompts_note = dict(old.prompts), old.prompts_note
        return list(old.starts)

    def starts(self, done: frozenset[int] = frozenset()) -> Iterator[StartRecord]:
        """Run every start in schedule order (but those in ``done``), yielding each record as it finishes."""
        if not done:
            self.prompts = None
            self.prompts_note = "no start came up: nothing sized"
        factory = self.server_factory or _default_server_factory()
        todo = [(i, r, role) for i, (r, role) in enumerate(schedule(self.plan.starts)) if i not in done]
        if self.max_new_starts is not None and len(todo) > self.max_new_starts:
            todo, stopped = todo[: self.max_new_starts], True
        else:
            stopped = False
        prestart = getattr(self.bench, "prestart", None)  # benchmark workers import vLLM while a server starts
        if prestart is not None:
            for role in dict.fromkeys(role for _, _, role in todo):
                prestart(self.builds[role])
        for index, round_, role in todo:
            self._stop_left_behind()
            build = self.builds[role]
            folder = self.out_dir / "starts" / f"{index:02d}-{role}-{safe_label(build.label)}"
            folder.mkdir(parents=True, exist_ok=True)
            rec = StartRecord(index, round_, role, build.label, folder=str(folder.relative_to(self.out_dir)))
            rec.started = datetime.now(UTC).isoformat(timespec="seconds")
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
        if stopped:
            self.log(f"[ab] stopping after {len(todo)} new starts (--max-new-starts); resume with --resume")

    def run(self) -> Run:
        self.preflight()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prompts = None
        self.prompts_note = "no start came up: nothing sized"
        records: list[StartRecord] = self._previous()
        run = None
        try:
            if records and self._over(self._run(records)):
                return self._run(records)
            for rec in self.starts(frozenset(r.index for r in records)):
                records.append(rec)
                run = self._run(records)
                (self.out_dir / "run.json").write_text(json.dumps(run.to_json(), indent=1))  # after every start
                if self._over(run):
                    break
        finally:
            if self.workers is not None:
                self.workers.close()
        return run if run is not None else self._run(records)

    def _over(self, run: Run) -> bool:
        """After a round that completes a look (``moegate/ab/verdict.py``): log what it decided, and whether the
        run is over (every level settled, a build without a good start, or the cap)."""
        rounds = completed_rounds(run)
        if rounds < (self.plan.min_starts or 2):
            return False
        if any(s.round >= rounds for s in run.starts):  # the next round has begun: this look was logged before
            return False
        v = judge(run, self.out_dir)
        look = v.looks[-1] if v.looks else None
        if look is not None and look.starts == rounds:
            self.log(f"[ab] look after round {rounds}: " + ", ".join(f"c={c} {code}" for c, code in look.codes.items()))
        if v.over and rounds < self.plan.starts:
            self.log(f"[ab] the run is over at {rounds} starts a build ({v.state}); no round added")
        return v.over

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
            self.model_hash,
        )
