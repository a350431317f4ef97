"""The golden rule: one build's records against the golden of its key (``moegate/e2e/golden_records.py``), or blessed into it.

A key holds what changes the numbers (vLLM release, device class, dtype, model hash, flags, the run's size
and in-flight count); the records are greedy token ids or GSM8K responses. Goldens serve regression, the
verdict is the comparison (issue 28): where the key has a golden the records must match it; where it has
none (a pull request's dev build, a runner's device that never had one) the row says so, with the file
this run wrote (``.obtained``) and the exact command that blesses it, and passes, unless ``--strict-goldens``
(moegate's own release pair, ``noxfile.py`` ``_e2e``) makes a missing golden a failure.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from moegate.core.hashing import model_hash
from moegate.e2e import golden_records
from moegate.e2e.golden_records import device_class, flag_value
from moegate.e2e.greedy_passes import Completion, Decode
from moegate.e2e.rules import greedy, gsm8k
from moegate.e2e.run_data import BuildRun, Options
from moegate.e2e.verdict import GateResult


def golden_key(gate: str, run: BuildRun, opts: Options, in_flight: int | None) -> golden_records.Key:
    flags = (*opts.server_args, *run.build.server_args)
    return golden_records.Key(
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


def check_golden(gate: str, run: BuildRun, opts: Options, in_flight: int | None, decode: Decode | None) -> GateResult:
    """One build's records against the golden of its key (or blessed into it)."""
    key = golden_key(gate, run, opts, in_flight)
    name = f"{gate} golden, {run.build.label}" + (f", {in_flight} in flight" if in_flight else "")
    if gate == "greedy":
        records = [c.record(in_flight or 1) for c in run.greedy[in_flight or 1]]
    else:
        records = run.gsm8k.records
    try:
        outcome = golden_records.check(
            key, provenance(run, opts, in_flight), records, bless=opts.bless, directory=opts.golden_dir
        )
    except golden_records.GoldenError as exc:
        return GateResult(name, False, str(exc), "")
    if outcome.status in ("blessed", "match"):
        return GateResult(name, True, outcome.message, "")
    if outcome.status == "missing":
        if opts.strict_goldens:
            return GateResult(name, False, f"FAIL (--strict-goldens): {outcome.message}", "")
        command = opts.bless_command or golden_records.BLESS
        return GateResult(
            name, True,
            f"PASS (golden missing, not judged: the comparison decides): no golden for this key yet: "
            f"{outcome.path.name}; obtained: {golden_records.obtained_path(outcome.path)}; to bless it: {command}",
            "",
        )  # fmt: skip
    assert outcome.records is not None
    if gate == "greedy":
        want = [Completion.from_record(r) for r in outcome.records]
        res = greedy.compare("golden", want, run.build.label, run.greedy[in_flight or 1], gate=name, decode=decode)
    else:
        res = gsm8k.compare(outcome.records, records, labels=("golden", run.build.label), gate=name)
    res.passed = False
    res.summary = f"{outcome.message}: {res.summary}"
    return res
