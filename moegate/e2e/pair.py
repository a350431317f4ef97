"""Both builds' servers up together: each started once, every gate and the scoring phase served by that start.

``serve_pair`` starts both builds' servers (or attaches to running ones, ``urls``), runs
each build's gates against its own server, both builds at once, then the scoring phase of
``moegate/e2e/scored.py`` against both, then stops the servers it started (in every case: the ``ExitStack`` stops them on any error, and
``teardown_on_termination`` turns SIGTERM into that). ``compare`` turns the records into
verdicts: the batch-robust ones by default, ``strict`` the byte-identity ones of
``moegate/e2e/run.py``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from moegate.core import progress
from moegate.e2e import greedy, scored, scored_verdicts, stats
from moegate.e2e import run as e2e
from moegate.e2e.prompts import Prompt
from moegate.e2e.verdict import GateResult
from moegate.serve.attached import AttachedServer
from moegate.serve.build import Build, BuildError
from moegate.serve.server import Server


def serve_pair(
    builds: Sequence[Build],
    prompts: Sequence[Prompt],
    opts: e2e.Options,
    out: Path,
    *,
    all_prompts: Callable[[int], Sequence[Prompt]],
    available: int,
    on_run: Callable[[e2e.BuildRun], None] | None = None,
    urls: Mapping[str, str] | None = None,
) -> tuple[list[e2e.BuildRun], scored.ScoreData | None]:
    """``urls`` (label: URL) names builds whose server already runs (``moegate/serve/attached.py``): used, not started."""
    if len(builds) != 2 or builds[0].label == builds[1].label:
        raise ValueError("the e2e run compares two builds with different labels")
    urls = urls or {}
    runs: list[e2e.BuildRun] = []
    data: scored.ScoreData | None = None
    with contextlib.ExitStack() as stack:
        owned = {
            b.label: Server(
                b, opts.model, opts.server_args, log_path=out / f"server-{b.label}.log",
                startup_timeout_s=opts.startup_timeout_s,
            )
            for b in builds if b.label not in urls
        }  # fmt: skip
        for own in owned.values():
            stack.callback(own.stop)  # registered before the start: a failed or interrupted start is stopped too
        with progress.stage("both servers: start", prefix="e2e"):
            infos = start_and_describe(builds, list(owned.values()))
        servers: list[Server | AttachedServer] = []
        for build, info in zip(builds, infos, strict=True):
            if build.label in owned:
                servers.append(owned[build.label])
            else:
                attached = AttachedServer(build, opts.model, urls[build.label], vllm_version=info.get("vllm"))
                attached.start()
                servers.append(attached)

        def _measure(build: Build, info: dict[str, Any], srv: Server | AttachedServer) -> e2e.BuildRun:
            run = e2e.BuildRun(build, info=info if build.label in owned else {**info, "attached": urls[build.label]})
            t0 = time.monotonic()
            run.start_s = srv.started_s
            e2e.measure(srv, run, prompts, opts, out)
            run.seconds["total"] = time.monotonic() - t0 + (srv.started_s or 0.0)
            return run

        # both builds' gates at once: each server gets the same requests in the same waves as alone (no batch is
        # shared between servers), and one build's lm-eval start-up and request round trips overlap the other's work
        with ThreadPoolExecutor(len(builds)) as pool:
            futures = [pool.submit(_measure, *job) for job in zip(builds, infos, servers, strict=True)]
            for future in futures:
                runs.append(future.result())
                if on_run is not None:
                    on_run(runs[-1])
        if not opts.strict:
            labels = (builds[0].label, builds[1].label)
            greedy_1 = []
            for run, srv in zip(runs, servers, strict=True):
                if 1 not in run.greedy:  # the scored sequences are the 1-in-flight continuations
                    run.greedy[1] = greedy.run_pass(
                        srv.url, srv.model_name, prompts, 1, max_tokens=opts.max_tokens, check_alive=_alive(srv)
                    )
                greedy_1.append(run.greedy[1])
            data = scored.measure(
                servers, labels, (greedy_1[0], greedy_1[1]), prompts, all_prompts=all_prompts, available=available,
                in_flight=opts.in_flight, max_tokens=opts.max_tokens, detect=opts.score_detect,
                cap=opts.score_cap, timeout_s=opts.score_timeout_s,
            )  # fmt: skip
            if "gsm8k" in opts.gates:
                data.gsm8k_divergences = scored.rescore_gsm8k(
                    servers, labels, runs[0].gsm8k, runs[1].gsm8k, timeout_s=opts.score_timeout_s
                )
                _extend_gsm8k(servers, runs, data, opts, out)
    for run in runs:
        e2e.write_raw(run, out)
    if data is not None:
        scored.write(data, out)
    return runs, data


def start_together(servers: Sequence[Server]) -> None:
    """Start every server at once (one thread each polls its own health): the starts overlap.

    A start is mostly one process importing vLLM and torch; two of them side by side on the 2-core
    machine took about as long as one. The first failure is raised once all have returned. On a GPU
    they start one after the other: an engine sizes its KV cache from the device memory in use while
    it profiles, and counts another engine's allocations as its own (seen on the H200: starts at once
    failed with a negative "Available KV cache memory", ``results/e2e-h200-scored.md``).
    """
    from moegate.serve.server import gpu_memory_used_mib

    if not servers:
        return
    if gpu_memory_used_mib() is not None:
        for s in servers:
            s.start()
        return

    with ThreadPoolExecutor(len(servers)) as pool:
        futures = [pool.submit(s.start) for s in servers]
        errors = [f.exception() for f in futures]
    for exc in errors:
        if exc is not None:
            raise exc


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


def _gsm8k_cap(opts: e2e.Options) -> int:
    from moegate.e2e import gsm8k

    return min(gsm8k.ALL_QUESTIONS, opts.gsm8k_cap or scored.GSM8K_CAP_FACTOR * opts.gsm8k_limit)


def _discordance(runs: Sequence[e2e.BuildRun]) -> float:
    base, pr = runs
    rates = []
    pairs = [(base.gsm8k, pr.gsm8k)] + [(r.gsm8k, r.gsm8k_repeat) for r in runs if r.gsm8k_repeat is not None]
    for x, y in pairs:
        n = max(len(x.records), 1)
        for k in ("exact_match_strict", "exact_match_flexible"):
            a = {int(r["doc_id"]): int(r[k]) for r in x.records}
            b = {int(r["doc_id"]): int(r[k]) for r in y.records}
            rates.append(stats.mcnemar(a, b).discordant / n)
    return max(rates, default=0.0)


def _extend_gsm8k(servers: Sequence[Any], runs: Sequence[e2e.BuildRun], data: scored.ScoreData, opts: e2e.Options,
                  out: Path) -> None:  # fmt: skip
    """Too few questions for the promise at the measured discordance: run GSM8K again on more, up to the cap."""
    from moegate.e2e import gsm8k

    cap = _gsm8k_cap(opts)
    limit = opts.gsm8k_limit
    for rnd in range(1, scored.ROUNDS + 1):
        needed = stats.needed_questions(_discordance(runs), detect=opts.gsm8k_detect)
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
            run.gsm8k = gsm8k.run_on_server(srv, out / f"gsm8k-{label}-n{limit}", **kw)
            if run.gsm8k_repeat is not None:
                run.gsm8k_repeat = gsm8k.run_on_server(srv, out / f"gsm8k-{label}-n{limit}-repeat", **kw)
        data.gsm8k_divergences = scored.rescore_gsm8k(
            servers, (runs[0].build.label, runs[1].build.label), runs[0].gsm8k, runs[1].gsm8k,
            timeout_s=opts.score_timeout_s,
        )  # fmt: skip
        data.rounds[-1]["round"] = rnd


def compare(
    base: e2e.BuildRun, pr: e2e.BuildRun, opts: e2e.Options, decode: greedy.Decode | None, data: scored.ScoreData | None
) -> list[GateResult]:
    """Every gate's verdict. Strict: byte identity (``run.compare_builds``); else the rules of docs/e2e-rules.md."""
    if opts.strict:
        return e2e.compare_builds(base, pr, opts, decode)
    if data is None or not data.sequences:
        return [
            GateResult("scored", False, "no scores: the scoring phase did not run (use --strict for byte identity)")
        ]
    tie = scored_verdicts.tie_bound(data)
    results: list[GateResult] = [scored_verdicts.scored_result(data, detect=opts.score_detect)]
    if "greedy" in opts.gates:
        for c in opts.in_flight:
            pairs = [(f"greedy, {r.build.label} twice, {c} in flight", "first", r.greedy[c], "second", r.repeat[c])
                     for r in (base, pr) if c in r.repeat]  # fmt: skip
            pairs.append((f"greedy, {c} in flight", base.build.label, base.greedy[c], pr.build.label, pr.greedy[c]))
            for gate, la, a, lb, b in pairs:
                res = greedy.compare(la, a, lb, b, gate=gate, decode=decode)
                results.append(scored_verdicts.classify_greedy(res, la, lb, len(a), tie))
            for r in (base, pr):
                results.append(e2e.check_golden("greedy", r, opts, c, decode))
    if "gsm8k" in opts.gates:
        repeats = [(r.build.label, r.gsm8k, r.gsm8k_repeat) for r in (base, pr) if r.gsm8k_repeat is not None]
        for lab, r1, r2 in repeats:
            results.append(_noise_row(lab, r1, r2))
        results.append(
            scored_verdicts.gsm8k_result(
                (base.build.label, pr.build.label), base.gsm8k, pr.gsm8k, repeats, data.gsm8k_divergences,
                scored_verdicts.gsm8k_tie_bound(data, {r.build.label: r.greedy.get(1, []) for r in (base, pr)}),
                detect=opts.gsm8k_detect, cap=_gsm8k_cap(opts),
            )
        )  # fmt: skip
        for r in (base, pr):
            results.append(e2e.check_golden("gsm8k", r, opts, None, None))
    return results


def _noise_row(label: str, r1: Any, r2: Any) -> GateResult:
    """A build against its own repeat: the GSM8K noise floor; fails only if the build disagrees with itself one way."""
    parts, bad = [], []
    for f, k in (("strict-match", "exact_match_strict"), ("flexible-extract", "exact_match_flexible")):
        t = stats.mcnemar(
            {int(r["doc_id"]): int(r[k]) for r in r1.records}, {int(r["doc_id"]): int(r[k]) for r in r2.records}
        )
        parts.append(f"{f} discordant {len(t.a_only)}/{len(t.b_only)} p={t.p:.3g}")
        if t.p < stats.ALPHA_GSM8K / 2:
            bad.append(f)
    differ = sum(1 for x, y in zip(r1.records, r2.records, strict=False) if x["response"] != y["response"])
    ok = not bad
    return GateResult(
        f"gsm8k, {label} twice", ok,
        f"{'PASS' if ok else 'FAIL'}: noise floor: {differ} of {len(r1.records)} responses differ; " + "; ".join(parts),
    )  # fmt: skip
