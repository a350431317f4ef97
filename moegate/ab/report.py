"""The A/B report: a Markdown table in the style of vLLM PR #62054's description, and a PNG plot.

``write(run, out_dir, ...)`` computes the verdict (``verdict.judge``: decode time a token, requests nested in
starts, looks over rounds) from a run's good starts, writes ``report.md`` (fits a CI job summary),
``verdict.json`` and ``throughput.png`` (``moegate/ab/plot.py``) into ``out_dir``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from moegate.ab.evidence import TrafficModel
from moegate.ab.latency import start_decode
from moegate.ab.plan import Run
from moegate.ab.plot import plot
from moegate.ab.stalls import Outlier, outliers
from moegate.ab.verdict import (
    DEFAULT_GATE_THRESHOLD,
    EQUIVALENT,
    FAIL,
    IMPROVED,
    PENDING,
    REGRESSED,
    UNRESOLVED,
    LevelVerdict,
    Verdict,
    geomean,
    judge,
    rule_text,
)

PLOT = "throughput.png"
MARKDOWN = "report.md"
VERDICT_JSON = "verdict.json"
PLOT_LINE = f"![output tok/s and decode time a token against concurrency]({PLOT})"


def _range(xs: Sequence[float], digits: int = 1) -> str:
    if not xs:
        return "–"
    lo, hi = f"{min(xs):.{digits}f}", f"{max(xs):.{digits}f}"
    return lo if lo == hi else f"{lo}–{hi}"


def _bytes(n: float) -> str:
    return f"{n / 2**20:.0f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


@dataclass(frozen=True)
class Report:
    verdict: Verdict
    markdown: str


WIDE = 9.0
"""A speed-up bound past +900 % (or a slow-down to a tenth) says only "unbounded": with Welch's few degrees of
freedom at a small share of alpha the exact bound runs to many digits, which reads as a figure. Shown as
"> +900%"; verdict.json keeps the exact value."""


def _pct(x: float) -> str:
    if x > WIDE:
        return f"> {WIDE:+.0%}"
    return f"{x:+.1%}"


def _speedup_cell(lv: LevelVerdict) -> str:
    if lv.speedup is None:
        return "–"
    text = f"{lv.speedup:+.1%}"
    if lv.speedup_ci is not None:
        text += f" [{_pct(lv.speedup_ci[0])}, {_pct(lv.speedup_ci[1])}]"
    return text.replace("-", "−")


def _verdict_cell(lv: LevelVerdict, margin: float) -> str:
    if lv.verdict in (IMPROVED, REGRESSED, FAIL):
        return f"**{lv.verdict}**"
    if lv.verdict == EQUIVALENT:
        return f"equivalent (±{margin:.0%})"
    return lv.verdict


def _at_cell(lv: LevelVerdict, v: Verdict) -> str:
    if lv.at is None:
        return "–"
    text = str(lv.at)
    if lv.used != (lv.at, lv.at):
        text += f" ({lv.used[0]} / {lv.used[1]} good)"
    if lv.verdict in (UNRESOLVED, FAIL, PENDING):
        text += " (cap)" if v.over else " (so far)"
    return text


def _sd_cell(lv: LevelVerdict) -> str:
    if lv.spread is None:
        return "–"
    text = f"{lv.spread:.2%}"
    if lv.resolves is not None and math.isfinite(lv.resolves):
        text += f" (±{lv.resolves:.1%})" if lv.resolves < 10 else " (> ±1000%)"
    return text


def markdown(
    run: Run,
    verdict: Verdict,
    traffic: TrafficModel | None = None,
    *,
    plot_name: str | None = PLOT,
    gate: bool = False,
    first_tokens: Sequence[Outlier] = (),
    decode_ms: dict[tuple[int, int], float] | None = None,
) -> str:
    b, p = run.builds["base"], run.builds["pr"]
    good = {role: sum(1 for s in run.starts if s.role == role and s.status == "ok") for role in ("base", "pr")}
    total = {role: sum(1 for s in run.starts if s.role == role) for role in ("base", "pr")}
    margin = verdict.plan.margin
    lines = [
        f"## Throughput A/B: `{b['label']}` (base) vs `{p['label']}` (PR)",
        "",
        f"Model `{run.model}`; server flags `{' '.join(run.server_args) or '(none)'}`"
        + (f"; base adds `{' '.join(b['server_args'])}`" if b["server_args"] else "")
        + (f"; PR adds `{' '.join(p['server_args'])}`" if p["server_args"] else "")
        + ".",
        (
            f"Good starts: base {good['base']} of {total['base']}, PR {good['pr']} of {total['pr']} "
            f"(interleaved A B | B A | ..., a fresh server each; {_state(verdict)}). Prompts: {run.dataset}"
            + (
                ", the same prompts every round."
                if not run.plan.get("vary_prompts", True)
                else ", other prompts each round."
            )
        ),
        (
            f"Per level: `vllm bench serve --max-concurrency c --num-warmups c --ignore-eos`, prompts "
            f"{_prompts(run)} ({run.prompts_note}). Warm-up: every start first ran an uncounted sweep over "
            f"every concurrency ({run.plan['warmup_rounds']} rounds each), so every kernel variant was compiled "
            f"before the measured sweep."
        ),
        "",
    ]
    header = [
        "in flight", "starts (base / PR)", "output tok/s, base", "output tok/s, PR", "tok/s change",
        "decode ms a token, base", "PR", "decode speed-up [CI]", "verdict", "settled at (starts a build)",
        "start-to-start sd (resolves)",
    ]  # fmt: skip
    if traffic is not None:
        header += [
            "expert bytes/step (base / PR)",
            "byte bound",
            f"achieved GB/s (base / PR), UVA peak {traffic.uva_peak_gbps:g}",
        ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for lv in verdict.levels:
        change = lv.tok_s_change
        row = [
            str(lv.concurrency),
            f"{len(lv.base_tok_s)} / {len(lv.pr_tok_s)}",
            _range(lv.base_tok_s),
            _range(lv.pr_tok_s),
            "–" if change is None else f"{change:+.1%}".replace("-", "−"),
            _range(lv.base_ms, 2),
            _range(lv.pr_ms, 2),
            _speedup_cell(lv),
            _verdict_cell(lv, margin),
            _at_cell(lv, verdict),
            _sd_cell(lv),
        ]
        if traffic is not None:
            t = traffic.level(lv.concurrency)
            base_b, pr_b = t.bytes_for("base"), t.bytes_for("pr")
            row.append(f"{_bytes(base_b)} ({t.paths['base']}) / {_bytes(pr_b)} ({t.paths['pr']})")
            row.append(f"{base_b / pr_b - 1:+.1%}".replace("-", "−") if pr_b > 0 else "–")
            cells = []
            for role, xs in (("base", lv.base_tok_s), ("pr", lv.pr_tok_s)):
                if xs:
                    gbps = traffic.achieved_gbps(lv.concurrency, role, geomean(xs))
                    cells.append(f"{gbps:.1f} ({gbps / traffic.uva_peak_gbps:.0%})")
                else:
                    cells.append("–")
            row.append(" / ".join(cells))
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        (
            f"**Rule.** {rule_text(verdict.plan, len(verdict.levels), verdict.gate_threshold)} Decode speed-up = "
            "geometric mean base / PR − 1 of the start figures the verdict's look used, with its interval; "
            "tok/s change = the ratio of the builds' geometric means − 1 over every good start (reported, not judged); "
            "*start-to-start sd*: the pooled sd of the start figures' logs at that look, and in brackets the change "
            "it resolves with 80 % power there (moegate/ab/verdict.py, moegate/ab/rule.py)."
        ),
    ]
    if verdict.looks:
        lines += [
            "",
            "**Looks**: "
            + "; ".join(
                f"after {look.starts} starts a build: " + ", ".join(f"c={c} {code}" for c, code in look.codes.items())
                for look in verdict.looks
            )
            + ".",
        ]
    notes = [
        f"c={lv.concurrency} {lv.verdict}: {lv.reason}" for lv in verdict.levels if lv.verdict in (UNRESOLVED, FAIL)
    ]
    if notes:
        lines += ["", "; ".join(notes) + "."]
    durations = _durations(run)
    if durations:
        lines += [
            "",
            "Measured run length per level (s, min–max over good starts): "
            + ", ".join(f"c={c}: {_range(ds)}" for c, ds in durations.items())
            + ".",
        ]
    if first_tokens:
        lines += [
            "",
            f"**First-token outliers** ({len(first_tokens)} measured runs; in output tok/s, not in the decode time "
            "the verdict judges; moegate/ab/stalls.py): " + "; ".join(o.describe() for o in first_tokens) + ".",
        ]
    lines += ["", *_per_start(run, decode_ms or {})]
    if traffic is not None:
        src = {traffic.level(lv.concurrency).source for lv in verdict.levels}
        lines += [
            "",
            (
                f"**Evidence.** {traffic.describe()}. Expert reads per decode step from "
                f"{', '.join(sorted(src))}; a build's path at each level is the dispatch rule's for "
                "host-resident weights (PR: always sorted; base: naive while c·top_k·4 ≤ experts); "
                "byte bound = the base's bytes a step over the PR's − 1, the decode speed-up if a step were "
                "nothing but expert reads over PCIe; achieved GB/s = bytes/step × (tok/s ÷ c), prefill ignored."
            ),
        ]
    if gate:
        lines += [
            "",
            "**Gate: passed.**"
            if verdict.gate_passed
            else "**Gate: FAILED**: " + "; ".join(verdict.gate_failures) + ".",
        ]
    failed = [s for s in run.starts if s.status != "ok"]
    if failed:
        lines += ["", f"### Failed starts ({len(failed)}; none of their figures is counted)"]
        for s in failed:
            summary = (
                f"<details><summary>start {s.index + 1}: {s.role} ({s.label}), round {s.round}: "
                f"{_html(s.error or '')}</summary>"
            )
            lines += ["", summary, "", "```", (s.log_tail or "").rstrip()[-4000:], "```", "", "</details>"]
    if plot_name:
        lines += ["", PLOT_LINE.replace(f"({PLOT})", f"({plot_name})")]
    lines += [
        "",
        (
            "Raw results: `starts/*/measured-c*.json` (vLLM's own result dicts, per request where the run kept "
            "them), warm-ups beside them, `run.json` (schedule, sizing, per-start status)."
        ),
    ]
    return "\n".join(lines) + "\n"


def _state(v: Verdict) -> str:
    if v.state == "settled":
        return f"every level settled after {v.looks[-1].starts} starts a build"
    if v.state == "cap":
        return f"the cap, {v.plan.cap} starts a build, reached"
    if v.state == "no good start":
        return "stopped: a build has no good start"
    return "the run is not over"


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _prompts(run: Run) -> str:
    if not run.prompts:
        return "(not sized)"
    return ", ".join(f"{n} at c={c}" for c, n in sorted(run.prompts.items()))


def _per_start(run: Run, decode_ms: dict[tuple[int, int], float]) -> list[str]:
    """Every start in schedule order with its measured tok/s and decode time a token, so a reader sees drift
    across the run and across the sessions a resumed run spans (the start time, UTC; '?' in runs written
    before it was kept)."""
    levels = list(run.plan["concurrency"])
    lines = [
        "<details><summary>Per start: measured output tok/s (decode ms a token)</summary>",
        "",
        "| start | round | build | started (UTC) | status | " + " | ".join(f"c={c}" for c in levels) + " |",
        "|" + "---|" * (5 + len(levels)),
    ]
    for s in run.starts:
        cells = []
        for c in levels:
            if c not in s.measured or s.status != "ok":
                cells.append("–")
                continue
            ms = decode_ms.get((s.index, c))
            cells.append(f"{s.measured[c]:.1f}" + (f" ({ms:.2f})" if ms is not None else ""))
        started = s.started.replace("T", " ").removesuffix("+00:00") or "?"
        lines.append(f"| {s.index + 1} | {s.round} | {s.label} | {started} | {s.status} | " + " | ".join(cells) + " |")
    return [*lines, "", "</details>"]


def _durations(run: Run) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for s in run.starts:
        if s.status == "ok":
            for c, d in sorted(s.durations.items()):
                out.setdefault(c, []).append(d)
    return out


def write(
    run: Run,
    out_dir: str | Path,
    traffic: TrafficModel | None = None,
    *,
    gate_threshold: float = DEFAULT_GATE_THRESHOLD,
    gate: bool = False,
    with_plot: bool = True,
) -> Report:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    verdict = judge(run, out, gate_threshold)
    png = plot(run, verdict, out / PLOT) if with_plot else None
    decode_ms = {key: sd.median_ms for key, sd in start_decode(run, out).items()}
    md = markdown(
        run,
        verdict,
        traffic,
        plot_name=PLOT if png else None,
        gate=gate,
        first_tokens=outliers(run, out),
        decode_ms=decode_ms,
    )
    (out / MARKDOWN).write_text(md)
    payload = verdict.to_json()
    if traffic is not None:
        payload["traffic"] = {
            "model": traffic.describe(),
            "uva_peak_gbps": traffic.uva_peak_gbps,
            "uva_peak_source": traffic.peak_source,
            "levels": {
                lv.concurrency: {
                    **{k: v for k, v in vars(traffic.level(lv.concurrency)).items() if k != "concurrency"},
                    "achieved_gbps": {
                        role: traffic.achieved_gbps(lv.concurrency, role, geomean(xs))
                        for role, xs in (("base", lv.base_tok_s), ("pr", lv.pr_tok_s))
                        if xs
                    },
                }
                for lv in verdict.levels
            },
        }
    (out / VERDICT_JSON).write_text(json.dumps(payload, indent=1))
    return Report(verdict, md)
