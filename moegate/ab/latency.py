"""Decode time a token, per request and per start, read from vLLM's own result dicts of an A/B run.

A request's decode time a token is ``(latency - ttft) / (output_len - 1)``: the time from its first token
to its last over the tokens after the first, first-token waits left out (vLLM's per-request TPOT, which
its ``median_tpot_ms`` summarizes). A PR to the MoE dispatch changes the decode step, so this is the
quantity the verdict judges (``moegate/ab/rule.py``); a start's figure at a level is the median over the
run's requests.

The driver asks ``vllm bench serve`` for ``--save-detailed``, which keeps ``ttfts``, ``output_lens`` and
``itls`` in the result dict beside ``latencies`` (vLLM 0.32.0 and 0.33.0 drop them without it). From those
the per-request times are computed here, and their median must agree with vLLM's own ``median_tpot_ms``
(a check that the fields are read as vLLM meant them). A run written before the driver asked for them
has only the summary: its start figure is ``median_tpot_ms`` itself (the same median), and the spread of
its requests ``std_tpot_ms / mean_tpot_ms`` (the sd of the log by the delta method; vLLM's ``std`` divides
by n, so it is scaled by ``sqrt(n / (n - 1))``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from moegate.ab.plan import Run

PER_REQUEST = "per request"
SUMMARY = "vLLM's median_tpot_ms"
AGREE = 1e-6
"""Relative difference allowed between the median of the per-request times and vLLM's ``median_tpot_ms``:
the same floats through another order of operations."""


@dataclass(frozen=True)
class StartDecode:
    """One good start's decode time a token at one level."""

    index: int  # the start's index in the schedule (0-based)
    role: str
    concurrency: int
    median_ms: float  # median over the run's requests
    requests: int
    log_sd: float | None  # sd of log decode time over the run's requests; None when unknown
    source: str  # PER_REQUEST or SUMMARY
    log_residuals: tuple[float, ...] = ()  # log(request) - log(median), per request, when PER_REQUEST

    @property
    def log_median(self) -> float:
        return math.log(self.median_ms)


def request_decode_ms(result: dict) -> list[float] | None:
    """Each completed request's decode time a token (ms), in the result's order; None when the dict has no
    per-request fields (a run without ``--save-detailed``). Requests of one output token have none."""
    lat, ttft, out = (result.get(k) for k in ("latencies", "ttfts", "output_lens"))
    if not (isinstance(lat, list) and isinstance(ttft, list) and isinstance(out, list)):
        return None
    if not len(lat) == len(ttft) == len(out):
        raise ValueError(f"per-request fields of unequal length: {len(lat)} latencies, {len(ttft)} ttfts, {len(out)}")
    times = []
    for latency, first, n in zip(lat, ttft, out):
        if isinstance(n, int) and n > 1:
            times.append(1000.0 * (float(latency) - float(first)) / (n - 1))
    return times


def from_result(result: dict, where: str) -> tuple[float, int, float | None, str, tuple[float, ...]] | None:
    """(median ms, requests, log sd, source, log residuals) of one measured run, or None when the dict has
    neither per-request fields nor ``median_tpot_ms``. ValueError when the per-request median disagrees
    with vLLM's, or a decode time is not positive."""
    times = request_decode_ms(result)
    if times:
        if min(times) <= 0:
            raise ValueError(f"{where}: a request's decode time is {min(times)} ms (latency before first token?)")
        median = statistics.median(times)
        vllm = result.get("median_tpot_ms")
        if isinstance(vllm, (int, float)) and abs(median - vllm) > AGREE * max(abs(vllm), 1e-12):
            raise ValueError(
                f"{where}: the per-request decode times' median is {median!r} ms, vLLM's median_tpot_ms "
                f"{vllm!r}: the result's fields are not what this reader takes them for"
            )
        logs = [math.log(t) for t in times]
        sd = statistics.stdev(logs) if len(logs) >= 2 else None
        return median, len(times), sd, PER_REQUEST, tuple(x - math.log(median) for x in logs)
    try:
        median = float(result["median_tpot_ms"])
    except (KeyError, TypeError, ValueError):
        return None
    if not median > 0:
        return None
    n = int(result.get("completed") or 0)
    sd = None
    try:
        mean, std = float(result["mean_tpot_ms"]), float(result["std_tpot_ms"])
        if n >= 2 and mean > 0:
            sd = std / mean * math.sqrt(n / (n - 1))
    except (KeyError, TypeError, ValueError):
        pass
    return median, n, sd, SUMMARY, ()


def start_decode(run: Run, folder: str | Path) -> dict[tuple[int, int], StartDecode]:
    """``(start index, concurrency) -> StartDecode`` for every good start's measured runs that have a decode
    time; a run whose JSON is missing, or has neither form of the figure, is left out (its level then has
    one start fewer, which the verdict counts)."""
    out: dict[tuple[int, int], StartDecode] = {}
    for s, c, raw in run.measured_results(folder):
        got = from_result(raw, str(Path(folder) / s.folder / f"measured-c{c}.json"))
        if got is not None:
            median, n, sd, source, residuals = got
            out[(s.index, c)] = StartDecode(s.index, s.role, c, median, n, sd, source, residuals)
    return out


def by_level(decode: dict[tuple[int, int], StartDecode], concurrency: int) -> dict[str, list[StartDecode]]:
    """One level's start figures per build, in schedule order."""
    out: dict[str, list[StartDecode]] = {"base": [], "pr": []}
    for (_, c), sd in sorted(decode.items()):
        if c == concurrency:
            out[sd.role].append(sd)
    return out
