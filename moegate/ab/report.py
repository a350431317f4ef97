"""The A/B report: a Markdown table in the style of vLLM PR #62054's description, and a PNG plot.

``write(run, out_dir, ...)`` computes the verdict (``verdict.compare``) from a run's good
starts, writes ``report.md`` (fits a CI job summary), ``verdict.json`` and
``throughput.png`` (throughput against concurrency, both builds: geometric mean, each
start as a dot, the min-max spread as a bar) into ``out_dir``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from moegate.ab.evidence import TrafficModel
from moegate.ab.latency import DecodeLevel, decode_times
from moegate.ab.plan import Run
from moegate.ab.stalls import Outlier, outliers
from moegate.ab.verdict import (
    DEFAULT_ALPHA,
    DEFAULT_GATE_THRESHOLD,
    DEFAULT_MIN_CHANGE,
    DEFAULT_POWER,
    DEFAULT_RESOLVE_CHANGE,
    NO_VERDICT,
    STARTS_CAP,
    Verdict,
    compare,
    rule_text,
)

PLOT = "throughput.png"
MARKDOWN = "report.md"
VERDICT_JSON = "verdict.json"


def _range(xs: Sequence[float]) -> str:
    if not xs:
        return "–"
    lo, hi = min(xs), max(xs)
    return f"{lo:.1f}" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f}–{hi:.1f}"


def _geomean(xs: Sequence[float]) -> float:
    return math.exp(math.fsum(math.log(x) for x in xs) / len(xs))


def describe_decode(d: DecodeLevel) -> str:
    """One level of the report's decode-time line: each build's range, then the PR's speed-up."""
    sides = ", ".join(f"{role} {_range(xs)}" for role, xs in (("base", d.base), ("PR", d.pr)))
    return f"c={d.concurrency}: {sides}" + (f" ({d.speedup:+.0%})" if d.speedup is not None else "")


def _bytes(n: float) -> str:
    return f"{n / 2**20:.0f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


@dataclass(frozen=True)
class Report:
    verdict: Verdict
    markdown: str


WIDE_RATIO = 10.0
"""An interval bound past ten times the base says only "unbounded": with one Welch degree of
freedom and Holm's small alpha the exact bound runs to twenty digits and more, which reads as a
figure. Shown as "> +900%"; verdict.json keeps the exact value."""


def _bound(ratio: float) -> str:
    return f"> {WIDE_RATIO - 1:+.0%}" if ratio > WIDE_RATIO else f"{ratio - 1:+.1%}"


def _needed_cell(n: int | None) -> str:
    if n is None:
        return "–"
    return f"> {STARTS_CAP}" if n > STARTS_CAP else str(n)


def _change_cell(lv) -> str:
    if lv.ratio is None:
        return "–"
    text = f"{lv.change:+.1%}"
    if lv.ci is not None:
        text += f" [{_bound(lv.ci[0])}, {_bound(lv.ci[1])}]"
    return text.replace("-", "−")


def markdown(
    run: Run,
    verdict: Verdict,
    traffic: TrafficModel | None = None,
    *,
    plot_name: str | None = PLOT,
    gate: bool = False,
    first_tokens: Sequence[Outlier] = (),
    decode: Sequence[DecodeLevel] = (),
) -> str:
    b, p = run.builds["base"], run.builds["pr"]
    good = {role: sum(1 for s in run.starts if s.role == role and s.status == "ok") for role in ("base", "pr")}
    total = {role: sum(1 for s in run.starts if s.role == role) for role in ("base", "pr")}
    lines = [
        f"## Throughput A/B: `{b['label']}` (base) vs `{p['label']}` (PR)",
        "",
        f"Model `{run.model}`; server flags `{' '.join(run.server_args) or '(none)'}`"
        + (f"; base adds `{' '.join(b['server_args'])}`" if b["server_args"] else "")
        + (f"; PR adds `{' '.join(p['server_args'])}`" if p["server_args"] else "")
        + ".",
        (
            f"Good starts: base {good['base']} of {total['base']}, PR {good['pr']} of {total['pr']} "
            f"(interleaved A B | B A | ..., a fresh server each). Prompts: {run.dataset}."
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
        "in flight", "starts (base / PR)", "output tok/s, base", "output tok/s, PR", "change [CI]", "verdict",
        f"starts a build to resolve ±{DEFAULT_RESOLVE_CHANGE:.0%}",
    ]  # fmt: skip
    if traffic is not None:
        header += ["expert bytes/step (base / PR)", f"achieved GB/s (base / PR), peak {traffic.uva_peak_gbps:g}"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for lv in verdict.levels:
        row = [
            str(lv.concurrency),
            f"{len(lv.base)} / {len(lv.pr)}",
            _range(lv.base),
            _range(lv.pr),
            _change_cell(lv),
            f"**{lv.verdict}**" if lv.verdict in ("improved", "regressed") else lv.verdict,
            _needed_cell(lv.starts_needed),
        ]
        if traffic is not None:
            t = traffic.level(lv.concurrency)
            row.append(
                f"{_bytes(t.bytes_for('base'))} ({t.paths['base']}) / {_bytes(t.bytes_for('pr'))} ({t.paths['pr']})"
            )
            cells = []
            for role, xs in (("base", lv.base), ("pr", lv.pr)):
                if xs:
                    gbps = traffic.achieved_gbps(lv.concurrency, role, _geomean(xs))
                    cells.append(f"{gbps:.1f} ({gbps / traffic.uva_peak_gbps:.0%})")
                else:
                    cells.append("–")
            row.append(" / ".join(cells))
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        (
            f"**Rule.** {rule_text(verdict.alpha, verdict.min_change, verdict.gate_threshold)} "
            f"Holm family here: {verdict.family_size} level(s); CI = the Holm-adjusted interval of "
            "PR/base − 1. "
            f"*Starts a build to resolve ±{DEFAULT_RESOLVE_CHANGE:.0%}*: at this level's measured spread (pooled sd "
            f"of log tok/s), the fewest starts a build for which a true {DEFAULT_RESOLVE_CHANGE:.0%} change is "
            f"significant at alpha/m with {DEFAULT_POWER:.0%} power (exact noncentral t); a point estimate, "
            "so an order of magnitude (moegate/ab/verdict.py, rule item 6)."
        ),
    ]
    notes = [f"c={lv.concurrency}: {lv.reason}" for lv in verdict.levels if lv.verdict == NO_VERDICT]
    if notes:
        lines += ["", "No verdict: " + "; ".join(notes) + "."]
    durations = _durations(run)
    if durations:
        lines += [
            "",
            "Measured run length per level (s, min–max over good starts): "
            + ", ".join(f"c={c}: {_range(ds)}" for c, ds in durations.items())
            + ".",
        ]
    if decode:
        lines += [
            "",
            "**Decode time a token** (ms: vLLM's median time per output token after the first, min–max over "
            "good starts; in brackets the PR's decode speed-up, geomean base / geomean PR − 1; first tokens "
            "left out; descriptive, no verdict reads it; moegate/ab/latency.py): "
            + "; ".join(describe_decode(d) for d in decode)
            + ".",
        ]
    if first_tokens:
        lines += [
            "",
            f"**First-token outliers** ({len(first_tokens)} measured runs; counted like every run of a good start, "
            "moegate/ab/stalls.py): " + "; ".join(o.describe() for o in first_tokens) + ".",
        ]
    lines += ["", *_per_start(run)]
    if traffic is not None:
        src = {traffic.level(lv.concurrency).source for lv in verdict.levels}
        lines += [
            "",
            (
                f"**Evidence.** {traffic.describe()}. Expert reads per decode step from "
                f"{', '.join(sorted(src))}; a build's path at each level is the dispatch rule's for "
                "host-resident weights (PR: always sorted; base: naive while c·top_k·4 ≤ experts); "
                "achieved GB/s = bytes/step × (tok/s ÷ c), prefill ignored."
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
        lines += ["", f"![output tok/s against concurrency]({plot_name})"]
    lines += [
        "",
        (
            "Raw results: `starts/*/measured-c*.json` (vLLM's own result dicts), warm-ups beside them, "
            "`run.json` (schedule, sizing, per-start status)."
        ),
    ]
    return "\n".join(lines) + "\n"


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _prompts(run: Run) -> str:
    if not run.prompts:
        return "(not sized)"
    return ", ".join(f"{n} at c={c}" for c, n in sorted(run.prompts.items()))


def _per_start(run: Run) -> list[str]:
    """Every start in schedule order with its measured tok/s, so a reader sees drift across the run and
    across the sessions a resumed run spans (the start time, UTC; '?' in runs written before it was kept)."""
    levels = list(run.plan["concurrency"])
    lines = [
        "<details><summary>Per start: measured output tok/s</summary>",
        "",
        "| start | round | build | started (UTC) | status | " + " | ".join(f"c={c}" for c in levels) + " |",
        "|" + "---|" * (5 + len(levels)),
    ]
    for s in run.starts:
        cells = [f"{s.measured[c]:.1f}" if c in s.measured and s.status == "ok" else "–" for c in levels]
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


def plot(run: Run, verdict: Verdict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    levels = [lv.concurrency for lv in verdict.levels]
    xs = list(range(len(levels)))
    for role, offset, color in (("base", -0.08, "tab:blue"), ("pr", 0.08, "tab:orange")):
        label = f"{role}: {run.builds[role]['label']}"
        gx, gy, lo, hi = [], [], [], []
        for x, lv in zip(xs, verdict.levels):
            vals = lv.base if role == "base" else lv.pr
            if not vals:
                continue
            g = _geomean(vals)
            gx.append(x + offset)
            gy.append(g)
            lo.append(max(0.0, g - min(vals)))  # a single sample's geomean may differ from it in the last bit
            hi.append(max(0.0, max(vals) - g))
            ax.scatter([x + offset] * len(vals), vals, s=10, color=color, alpha=0.45, zorder=3)
        if gx:
            ax.errorbar(gx, gy, yerr=[lo, hi], fmt="o-", color=color, capsize=4, label=label + " (geomean, min–max)")
    for x, lv in zip(xs, verdict.levels):
        if lv.verdict in ("improved", "regressed") and lv.change is not None:
            ax.annotate(
                f"{lv.change:+.0%}",
                (x, max(lv.base + lv.pr)),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
    ax.set_xticks(xs, [str(c) for c in levels])
    ax.set_xlabel("requests in flight (--max-concurrency)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{run.builds['base']['label']} vs {run.builds['pr']['label']}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write(
    run: Run,
    out_dir: str | Path,
    traffic: TrafficModel | None = None,
    *,
    alpha: float = DEFAULT_ALPHA,
    min_change: float = DEFAULT_MIN_CHANGE,
    gate_threshold: float = DEFAULT_GATE_THRESHOLD,
    gate: bool = False,
    with_plot: bool = True,
) -> Report:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    verdict = compare(
        run.samples("base"), run.samples("pr"), alpha=alpha, min_change=min_change, gate_threshold=gate_threshold
    )
    png = plot(run, verdict, out / PLOT) if with_plot else None
    decode = decode_times(run, out)
    md = markdown(
        run,
        verdict,
        traffic,
        plot_name=PLOT if png else None,
        gate=gate,
        first_tokens=outliers(run, out),
        decode=decode,
    )
    (out / MARKDOWN).write_text(md)
    payload = verdict.to_json()
    if decode:
        payload["decode_ms"] = {
            d.concurrency: {"base": list(d.base), "pr": list(d.pr), "speedup": d.speedup} for d in decode
        }
    if traffic is not None:
        payload["traffic"] = {
            "model": traffic.describe(),
            "levels": {
                lv.concurrency: {
                    **{k: v for k, v in vars(traffic.level(lv.concurrency)).items() if k != "concurrency"},
                    "achieved_gbps": {
                        role: traffic.achieved_gbps(lv.concurrency, role, _geomean(xs))
                        for role, xs in (("base", lv.base), ("pr", lv.pr))
                        if xs
                    },
                }
                for lv in verdict.levels
            },
        }
    (out / VERDICT_JSON).write_text(json.dumps(payload, indent=1))
    return Report(verdict, md)
