"""One e2e run: each build served once, every gate run against that one start, then compared.

Per build, in order: describe it (its vLLM must import), start its server with the
common flags plus its own, run the greedy passes (1 in flight; then ``c`` in flight
twice, which must be byte-identical before two builds are compared there), run
GSM8K through lm-eval, stop the server. The gates of one build share one server
start because the start is the cost (on a 2-core CPU, ``results/ci-time.md``; on the
H200, ``results/e2e-h200-scored.md``). Then: each gate compares base with PR and each build with its golden.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moegate.core import progress
from moegate.core.hashing import model_hash
from moegate.e2e import goldens, greedy
from moegate.e2e.greedy import Completion
from moegate.e2e.prompts import Prompt
from moegate.e2e.verdict import GateResult
from moegate.serve.attached import AttachedServer
from moegate.serve.build import Build
from moegate.serve.server import Server

GATES = ("greedy", "gsm8k")


@dataclass
class Options:
    model: str
    server_args: tuple[str, ...]
    gates: tuple[str, ...] = GATES
    in_flight: tuple[int, ...] = (1, 4)
    max_tokens: int = greedy.MAX_TOKENS
    eval_python: str | None = None
    gsm8k_limit: int = 250
    gsm8k_task: str = "moegate_gsm8k"
    gsm8k_dir: str | None = None
    gsm8k_in_flight: int = 4
    gsm8k_repeat: bool = True
    """Run GSM8K twice on each server and compare builds only where each reproduces itself."""
    startup_timeout_s: float = 900
    bless: bool = False
    golden_dir: Path = goldens.E2E_GOLDEN_DIR
    """Where the goldens are read (and, with ``bless``, written): the committed ``golden/e2e`` by default."""
    strict: bool = False
    """Byte identity (greedy tokens, GSM8K responses) instead of the batch-robust rules (moegate/e2e/pair.py)."""
    score_detect: float = 0.001
    score_cap: int | None = None
    score_timeout_s: float = 300
    gsm8k_detect: float = 0.05
    gsm8k_cap: int | None = None


@dataclass
class BuildRun:
    build: Build
    info: dict[str, Any] = field(default_factory=dict)
    start_s: float | None = None
    greedy: dict[int, list[Completion]] = field(default_factory=dict)
    repeat: dict[int, list[Completion]] = field(default_factory=dict)
    gsm8k: Any = None
    gsm8k_repeat: Any = None
    seconds: dict[str, float] = field(default_factory=dict)


def device_class(info: dict[str, Any]) -> str:
    """The device part of a golden's key: the GPU's name, or the CPU's widest vector ISA."""
    dev = str(info.get("device", "cpu"))
    if dev != "cpu":
        return dev
    flags = ""
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
    except (OSError, StopIteration):
        pass
    for isa in ("amx_bf16", "avx512_bf16", "avx512f", "avx2"):
        if f" {isa}" in flags:
            return f"cpu-{isa}"
    return f"cpu-{platform.machine()}"


def flag_value(flags: Sequence[str], name: str, default: str) -> str:
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            return flags[i + 1]
        if f.startswith(name + "="):
            return f.split("=", 1)[1]
    return default


def measure(srv: Server | AttachedServer, run: BuildRun, prompts: Sequence[Prompt], opts: Options, out: Path) -> None:
    """Every asked-for gate against one running server of ``run.build``."""
    label = run.build.label
    if "greedy" in opts.gates:
        t = time.monotonic()
        passes = sum(2 if c > 1 else 1 for c in opts.in_flight)
        with progress.stage(f"{label}: greedy", passes, prefix="e2e", unit="passes") as bar:
            for c in opts.in_flight:
                greedy_kw: dict[str, Any] = {
                    "max_tokens": opts.max_tokens,
                    "check_alive": lambda: srv.check_alive(grace_s=5),
                }
                run.greedy[c] = greedy.run_pass(srv.url, srv.model_name, prompts, c, **greedy_kw)
                bar.advance()
                if c > 1:  # the same build twice at c in flight: the precondition for comparing two builds there
                    run.repeat[c] = greedy.run_pass(srv.url, srv.model_name, prompts, c, **greedy_kw)
                    bar.advance()
        run.seconds["greedy"] = time.monotonic() - t
    if "gsm8k" in opts.gates:
        from moegate.e2e import gsm8k

        t = time.monotonic()
        gsm8k_kw: dict[str, Any] = {
            "python": opts.eval_python or "", "limit": opts.gsm8k_limit, "task": opts.gsm8k_task, "data": opts.gsm8k_dir,
            "num_concurrent": opts.gsm8k_in_flight,
        }  # fmt: skip
        with progress.stage(f"{label}: GSM8K", 2 if opts.gsm8k_repeat else 1, prefix="e2e", unit="runs") as bar:
            run.gsm8k = gsm8k.run_on_server(srv, out / f"gsm8k-{run.build.label}", **gsm8k_kw)
            bar.advance()
            if opts.gsm8k_repeat:
                run.gsm8k_repeat = gsm8k.run_on_server(srv, out / f"gsm8k-{run.build.label}-repeat", **gsm8k_kw)
                bar.advance()
        run.seconds["gsm8k"] = time.monotonic() - t


def write_raw(run: BuildRun, out: Path) -> None:
    raw = {
        "build": run.build.label, "info": run.info, "start_s": run.start_s, "seconds": run.seconds,
        "server_args": list(run.build.server_args),
        "greedy": {str(c): [x.to_json() for x in v] for c, v in run.greedy.items()},
        "repeat": {str(c): [x.to_json() for x in v] for c, v in run.repeat.items()},
    }  # fmt: skip
    (out / f"greedy-{run.build.label}.json").write_text(json.dumps(raw) + "\n")


def serve_and_measure(build: Build, prompts: Sequence[Prompt], opts: Options, out: Path, **server_kw: Any) -> BuildRun:
    """Start the build's server once, run every asked-for gate against it, stop it."""
    run = BuildRun(build, info=build.describe())
    t0 = time.monotonic()
    log = out / f"server-{build.label}.log"
    server = Server(
        build, opts.model, opts.server_args, log_path=log, startup_timeout_s=opts.startup_timeout_s, **server_kw
    )
    with contextlib.ExitStack() as stack:
        with progress.stage(f"{build.label}: server start", prefix="e2e"):
            srv = stack.enter_context(server)
        run.start_s = srv.started_s
        measure(srv, run, prompts, opts, out)
    run.seconds["total"] = time.monotonic() - t0
    write_raw(run, out)
    return run


def golden_key(gate: str, run: BuildRun, opts: Options, in_flight: int | None) -> goldens.Key:
    flags = (*opts.server_args, *run.build.server_args)
    return goldens.Key(
        gate=gate,
        vllm=str(run.info.get("vllm", "unknown")),
        device=device_class(run.info),
        dtype=flag_value(flags, "--dtype", "auto"),
        model_hash=model_hash(opts.model) if Path(opts.model).is_dir() else opts.model.replace("/", "--"),
        flags=tuple(a for a in flags if a),
        size=f"p{len(run.greedy[in_flight or 1])}-t{opts.max_tokens}"
        if gate == "greedy"
        else f"n{len(run.gsm8k.records)}-{opts.gsm8k_task}-c{opts.gsm8k_in_flight}",  # grown runs: their own size
        in_flight=in_flight,
    )


def provenance(run: BuildRun, opts: Options, in_flight: int | None) -> dict[str, Any]:
    return {
        "vllm": run.info.get("vllm"), "torch": run.info.get("torch"), "python": run.info.get("python"),
        "device": run.info.get("device"), "driver": run.info.get("driver"), "model": opts.model,
        "model_hash": model_hash(opts.model) if Path(opts.model).is_dir() else None,
        "flags": [*opts.server_args, *run.build.server_args], "in_flight": in_flight,
        "date": _dt.date.today().isoformat(), "produced_by": "python -m moegate.e2e run --bless",
    }  # fmt: skip


def check_golden(
    gate: str, run: BuildRun, opts: Options, in_flight: int | None, decode: greedy.Decode | None
) -> GateResult:
    """One build's records against the golden of its key (or blessed into it)."""
    from moegate.e2e import gsm8k

    key = golden_key(gate, run, opts, in_flight)
    name = f"{gate} golden, {run.build.label}" + (f", {in_flight} in flight" if in_flight else "")
    if gate == "greedy":
        records = [c.record(in_flight or 1) for c in run.greedy[in_flight or 1]]
    else:
        records = run.gsm8k.records
    try:
        outcome = goldens.check(
            key, provenance(run, opts, in_flight), records, bless=opts.bless, directory=opts.golden_dir
        )
    except goldens.GoldenError as exc:
        return GateResult(name, False, str(exc), "")
    if outcome.status in ("blessed", "match"):
        return GateResult(name, True, outcome.message, "")
    if outcome.status == "missing":
        return GateResult(name, False, outcome.message, "")
    assert outcome.records is not None
    if gate == "greedy":
        want = [greedy.Completion.from_record(r) for r in outcome.records]
        res = greedy.compare("golden", want, run.build.label, run.greedy[in_flight or 1], gate=name, decode=decode)
    else:
        res = gsm8k.compare(outcome.records, records, labels=("golden", run.build.label), gate=name)
    res.passed = False
    res.summary = f"{outcome.message}: {res.summary}"
    return res


def compare_builds(base: BuildRun, pr: BuildRun, opts: Options, decode: greedy.Decode | None) -> list[GateResult]:
    from moegate.e2e import gsm8k

    results: list[GateResult] = []
    if "greedy" in opts.gates:
        for c in opts.in_flight:
            stable = []
            for r in (base, pr):
                if c in r.repeat:
                    res = greedy.compare(
                        "first", r.greedy[c], "second", r.repeat[c], gate=f"greedy, {r.build.label} twice, {c} in flight",
                        decode=decode,
                    )  # fmt: skip
                    results.append(res)
                    stable.append(res.passed)
            res = greedy.compare(
                base.build.label,
                base.greedy[c],
                pr.build.label,
                pr.greedy[c],
                gate=f"greedy, {c} in flight",
                decode=decode,
            )
            if not all(stable):
                res.passed = False
                res.summary = (
                    f"FAIL (strict): a build does not reproduce itself at {c} in flight (see above), so byte "
                    f"identity cannot hold here; drop --strict for the batch-robust rules; between builds: {res.summary}"
                )
            results.append(res)
            for r in (base, pr):
                results.append(check_golden("greedy", r, opts, c, decode))
    if "gsm8k" in opts.gates:
        stable = []
        for r in (base, pr):
            if r.gsm8k_repeat is not None:
                res = gsm8k.compare_runs(r.gsm8k, r.gsm8k_repeat, labels=("first", "second"))
                res.gate = f"gsm8k, {r.build.label} twice"
                results.append(res)
                stable.append(res.passed)
        res = gsm8k.compare_runs(base.gsm8k, pr.gsm8k, labels=(base.build.label, pr.build.label))
        if not all(stable):
            res.passed = False
            res.summary = (
                "FAIL (strict): a build's GSM8K responses do not reproduce themselves (see above), so byte "
                f"identity cannot hold here; drop --strict for the batch-robust rules; between builds: {res.summary}"
            )
        results.append(res)
        for r in (base, pr):
            results.append(check_golden("gsm8k", r, opts, None, None))
    return results


def environment_line() -> str:
    return f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cores"


def read_raw(out: Path, label: str) -> BuildRun:
    """A build's run read back from its raw files (``greedy-LABEL.json``, ``gsm8k-LABEL/``).

    So a run made elsewhere (a lent GPU machine, a CI job's artifact) can be compared,
    reported and blessed here without serving again.
    """
    raw = json.loads((out / f"greedy-{label}.json").read_text())
    build = Build(label, "(raw)", {}, tuple(raw.get("server_args", [])))
    run = BuildRun(build, info=raw["info"], start_s=raw.get("start_s"), seconds=raw.get("seconds", {}))

    run.greedy = {int(k): [greedy.Completion.from_record(c) for c in v] for k, v in raw.get("greedy", {}).items()}
    run.repeat = {int(k): [greedy.Completion.from_record(c) for c in v] for k, v in raw.get("repeat", {}).items()}
    from moegate.e2e import gsm8k

    # a run GSM8K's size rule grew (moegate/e2e/pair.py) left gsm8k-LABEL-nN folders: the largest N is what it judged
    grown = sorted(
        (int(p.name.rsplit("-n", 1)[1]), p.name)
        for p in out.glob(f"gsm8k-{label}-n*")
        if p.name.rsplit("-n", 1)[1].isdigit()
    )
    stem = grown[-1][1] if grown else f"gsm8k-{label}"
    for attr, folder in (
        ("gsm8k", out / stem / "lm_eval"),
        ("gsm8k_repeat", out / f"{stem}-repeat" / "lm_eval"),
    ):
        if folder.is_dir():  # with the decoded ids where the run recorded them
            setattr(run, attr, gsm8k.attach_decoded(gsm8k.read_run(folder), folder.parent / gsm8k.DECODED))
    return run
