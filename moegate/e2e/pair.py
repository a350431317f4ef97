"""The e2e tier's orchestrator: both builds' servers up together, each started once, every gate served by that start.

``serve_pair`` starts both builds' servers (or attaches to running ones, ``urls``), measures
each build's gates against its own server (``measure``: the greedy passes, then GSM8K), both
builds at once, then the scoring phase of ``moegate/e2e/scoring_phase.py`` against both (and GSM8K's
growth where its size rule asks), then stops the servers it started (in every case: the
``ExitStack`` stops them on any error, and ``teardown_on_termination`` turns SIGTERM into that),
and writes the raw files (``moegate/e2e/run_data.py``). The verdicts are the rules' (``rules.judge``).
The one start of a build is the cost (on a 2-core CPU, ``results/ci-time.md``; on the H200,
``results/e2e-h200-scored.md``), so every gate of a build shares it; ``python -m moegate.e2e run``
and the GPU tools (``lab/gpu/e2e_plan.sh``) run pairs through here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from moegate.core import progress
from moegate.e2e import greedy_passes, lmeval, paired, rules, scoring_phase
from moegate.e2e.prompts import Prompt
from moegate.e2e.run_data import BuildRun, Options, ScoreData, gsm8k_cap, write_raw, write_scores
from moegate.serve.attached import AttachedServer
from moegate.serve.build import Build, BuildError
from moegate.serve.server import Server, gpu_pids


def measure(
    srv: Server | AttachedServer,
    run: BuildRun,
    prompts: Sequence[Prompt],
    opts: Options,
    out: Path,
    *,
    reference: bool = False,
) -> None:
    """Every asked-for gate against one running server of ``run.build``.

    The reference re-rounding (``reference``) runs the greedy passes once at each in-flight count, the decode
    yardstick of ``equivalent``, and neither repeats nor GSM8K: nothing is judged of it."""
    label = run.build.label
    if "greedy" in opts.gates or reference:
        t = time.monotonic()
        passes = sum(2 if c > 1 and not reference else 1 for c in opts.in_flight)
        with progress.stage(f"{label}: greedy", passes, prefix="e2e", unit="passes") as bar:
            for c in opts.in_flight:
                greedy_kw: dict[str, Any] = {
                    "max_tokens": opts.max_tokens,
                    "check_alive": lambda: srv.check_alive(grace_s=5),
                }
                run.greedy[c] = greedy_passes.run_pass(srv.url, srv.model_name, prompts, c, **greedy_kw)
                bar.advance()
                if c > 1 and not reference:  # the same build twice at c in flight: each build's own noise there
                    run.repeat[c] = greedy_passes.run_pass(srv.url, srv.model_name, prompts, c, **greedy_kw)
                    bar.advance()
        run.seconds["greedy"] = time.monotonic() - t
    if "gsm8k" in opts.gates and not reference:
        t = time.monotonic()
        gsm8k_kw: dict[str, Any] = {
            "python": opts.eval_python or "", "limit": opts.gsm8k_limit, "task": opts.gsm8k_task, "data": opts.gsm8k_dir,
            "num_concurrent": opts.gsm8k_in_flight,
        }  # fmt: skip
        with progress.stage(f"{label}: GSM8K", 2 if opts.gsm8k_repeat else 1, prefix="e2e", unit="runs") as bar:
            run.gsm8k = lmeval.run_on_server(srv, out / f"gsm8k-{run.build.label}", **gsm8k_kw)
            bar.advance()
            if opts.gsm8k_repeat:
                run.gsm8k_repeat = lmeval.run_on_server(srv, out / f"gsm8k-{run.build.label}-repeat", **gsm8k_kw)
                bar.advance()
        run.seconds["gsm8k"] = time.monotonic() - t


def serve_pair(
    builds: Sequence[Build],
    prompts: Sequence[Prompt],
    opts: Options,
    out: Path,
    *,
    all_prompts: Callable[[int], Sequence[Prompt]],
    available: int,
    on_run: Callable[[BuildRun], None] | None = None,
    urls: Mapping[str, str] | None = None,
    reference: Build | None = None,
) -> tuple[list[BuildRun], ScoreData | None, BuildRun | None]:
    """Base and PR (``builds``), and the reference re-rounding of the base where given: the runs of base and PR, the
    scores, the reference's run. ``urls`` (label: URL) names builds whose server already runs
    (``moegate/serve/attached.py``): used, not started."""
    if len(builds) != 2 or builds[0].label == builds[1].label:
        raise ValueError("the e2e run compares two builds with different labels")
    if reference is not None and reference.label in (builds[0].label, builds[1].label):
        raise ValueError(f"the reference's label {reference.label} is a compared build's")
    urls = urls or {}
    runs: list[BuildRun] = []
    data: ScoreData | None = None
    ref_run: BuildRun | None = None
    every = [*builds, *([reference] if reference is not None else [])]
    with contextlib.ExitStack() as stack:
        owned = {
            b.label: Server(
                b, opts.model, opts.server_args, log_path=out / f"server-{b.label}.log",
                startup_timeout_s=opts.startup_timeout_s,
            )
            for b in every if b.label not in urls
        }  # fmt: skip
        for own in owned.values():
            stack.callback(own.stop)  # registered before the start: a failed or interrupted start is stopped too
        with progress.stage(f"{len(every)} servers: start", prefix="e2e"):
            infos = start_and_describe(builds, list(owned.values()))
            if reference is not None:  # a yardstick, not a build under test: nothing of it is keyed or compared
                infos.append({"vllm": None, "role": "reference"})
        servers: list[Server | AttachedServer] = []
        for build, info in zip(every, infos, strict=True):
            if build.label in owned:
                servers.append(owned[build.label])
            else:
                attached = AttachedServer(build, opts.model, urls[build.label], vllm_version=info.get("vllm"))
                attached.start()
                servers.append(attached)

        def _measure(build: Build, info: dict[str, Any], srv: Server | AttachedServer) -> BuildRun:
            run = BuildRun(build, info=info if build.label in owned else {**info, "attached": urls[build.label]})
            t0 = time.monotonic()
            run.start_s = srv.started_s
            measure(srv, run, prompts, opts, out, reference=reference is not None and build is reference)
            run.seconds["total"] = time.monotonic() - t0 + (srv.started_s or 0.0)
            return run

        # every build's gates at once: each server gets the same requests in the same waves as alone (no batch is
        # shared between servers), and one build's lm-eval start-up and request round trips overlap the other's work
        with ThreadPoolExecutor(len(every)) as pool:
            futures = [pool.submit(_measure, *job) for job in zip(every, infos, servers, strict=True)]
            for future in futures:
                runs.append(future.result())
                if on_run is not None:
                    on_run(runs[-1])
        if reference is not None:
            ref_run = runs.pop()
        ref_side = (reference.label, servers[2]) if reference is not None else None
        if not opts.strict:
            labels = (builds[0].label, builds[1].label)
            greedy_1 = []
            for run, srv in zip(runs, servers[:2], strict=True):
                if 1 not in run.greedy:  # the scored sequences are the 1-in-flight continuations
                    run.greedy[1] = greedy_passes.run_pass(
                        srv.url, srv.model_name, prompts, 1, max_tokens=opts.max_tokens, check_alive=_alive(srv)
                    )
                greedy_1.append(run.greedy[1])
            data = scoring_phase.measure(
                servers[:2], labels, (greedy_1[0], greedy_1[1]), prompts, all_prompts=all_prompts, available=available,
                in_flight=opts.in_flight, max_tokens=opts.max_tokens, detect=opts.score_detect,
                cap=opts.score_cap, timeout_s=opts.score_timeout_s, reference=ref_side,
                needed=lambda d: rules.needed_prompts(d, opts),
            )  # fmt: skip
            if "gsm8k" in opts.gates:
                data.gsm8k_divergences = scoring_phase.rescore_gsm8k(
                    servers[:2], labels, runs[0].gsm8k, runs[1].gsm8k, timeout_s=opts.score_timeout_s
                )
                _extend_gsm8k(servers[:2], runs, data, opts, out)
    for run in [*runs, *([ref_run] if ref_run is not None else [])]:
        write_raw(run, out)
    if data is not None:
        write_scores(data, out)
    return runs, data, ref_run


def start_together(servers: Sequence[Server]) -> None:
    """Start every server at once (one thread each polls its own health): the starts overlap.

    A start is mostly one process importing vLLM and torch; two of them side by side on the 2-core
    machine took about as long as one. The first failure is raised once all have returned. On a GPU
    they start one after the other: an engine sizes its KV cache from the device memory in use while
    it profiles, and counts another engine's allocations as its own (seen on the H200: starts at once
    failed with a negative "Available KV cache memory", ``results/e2e-h200-scored.md``), unless every server
    has a fixed KV cache (``--kv-cache-memory-bytes``): then vLLM skips that profiling, and 14 servers started
    side by side on the one H200 all came up (``lab/gpu/e2e_plan.sh``).
    """
    if not servers:
        return
    if gpu_pids() is not None and not all(_fixed_kv_cache(s.args + s.build.server_args) for s in servers):
        for s in servers:
            s.start()
        return

    with ThreadPoolExecutor(len(servers)) as pool:
        futures = [pool.submit(s.start) for s in servers]
        errors = [f.exception() for f in futures]
    for exc in errors:
        if exc is not None:
            raise exc


def _fixed_kv_cache(args: Sequence[str]) -> bool:
    return any(a == "--kv-cache-memory-bytes" or a.startswith("--kv-cache-memory-bytes=") for a in args)


def start_and_describe(builds: Sequence[Build], servers: Sequence[Server]) -> list[dict[str, Any]]:
    """Each build described by its own interpreter (``Build.describe``) while the servers start: both are
    mostly an import of vLLM, side by side. Builds of one interpreter and environment (the same build served
    twice, or with other flags) are described once: the description is the interpreter's. A build that cannot
    describe itself is the error reported, ahead of its server's failure to start."""
    keys = [(b.python, tuple(sorted(b.env.items()))) for b in builds]
    with ThreadPoolExecutor(len(builds)) as pool:
        once: dict[tuple[str, tuple[tuple[str, str], ...]], Future[dict[str, Any]]] = {}
        for b, key in zip(builds, keys, strict=True):
            if key not in once:
                once[key] = pool.submit(b.describe)
        described = [once[key] for key in keys]
        try:
            start_together(servers)
        except BaseException:
            for f in described:
                if isinstance(f.exception(), BuildError):
                    raise f.exception() from None  # type: ignore[misc]
            raise
        return [dict(f.result()) for f in described]


def _alive(srv: Server | AttachedServer) -> Callable[[], None]:
    return lambda: srv.check_alive(grace_s=5)


def _discordance(runs: Sequence[BuildRun]) -> float:
    base, pr = runs
    rates = []
    pairs = [(base.gsm8k, pr.gsm8k)] + [(r.gsm8k, r.gsm8k_repeat) for r in runs if r.gsm8k_repeat is not None]
    for x, y in pairs:
        n = max(len(x.records), 1)
        for k in ("exact_match_strict", "exact_match_flexible"):
            a = {int(r["doc_id"]): int(r[k]) for r in x.records}
            b = {int(r["doc_id"]): int(r[k]) for r in y.records}
            rates.append(paired.mcnemar(a, b).discordant / n)
    return max(rates, default=0.0)


def _extend_gsm8k(servers: Sequence[Any], runs: Sequence[BuildRun], data: ScoreData, opts: Options,
                  out: Path) -> None:  # fmt: skip
    """Too few questions for the promise at the measured discordance: run GSM8K again on more, up to the cap."""
    cap = gsm8k_cap(opts)
    limit = opts.gsm8k_limit
    for rnd in range(1, scoring_phase.ROUNDS + 1):
        needed = paired.needed_questions(_discordance(runs), detect=opts.gsm8k_detect)
        if needed <= limit or limit >= cap:
            return
        limit = min(needed, cap)
        data.rounds.append({"gsm8k_questions": limit, "needed_questions": needed})
        kw: dict[str, Any] = {
            "python": opts.eval_python or "", "limit": limit, "task": opts.gsm8k_task, "data": opts.gsm8k_dir,
            "num_concurrent": opts.gsm8k_in_flight,
        }  # fmt: skip
        for run, srv in zip(runs, servers, strict=True):
            label = run.build.label
            run.gsm8k = lmeval.run_on_server(srv, out / f"gsm8k-{label}-n{limit}", **kw)
            if run.gsm8k_repeat is not None:
                run.gsm8k_repeat = lmeval.run_on_server(srv, out / f"gsm8k-{label}-n{limit}-repeat", **kw)
        data.gsm8k_divergences = scoring_phase.rescore_gsm8k(
            servers, (runs[0].build.label, runs[1].build.label), runs[0].gsm8k, runs[1].gsm8k,
            timeout_s=opts.score_timeout_s,
        )  # fmt: skip
        data.rounds[-1]["round"] = rnd
