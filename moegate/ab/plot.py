"""The A/B report's plot: per level, both builds' output tok/s (the figure the change description claims) and their
decode time a token (the one the verdict judges): geometric mean, each start as a dot, the min-max spread as a bar."""

from __future__ import annotations

from pathlib import Path

from moegate.ab.plan import Run
from moegate.ab.verdict import IMPROVED, REGRESSED, Verdict, geomean


def plot(run: Run, verdict: Verdict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    levels = [lv.concurrency for lv in verdict.levels]
    xs = list(range(len(levels)))
    panels = (
        (axes[0], "output tokens/s (reported)", lambda lv, role: lv.base_tok_s if role == "base" else lv.pr_tok_s),
        (axes[1], "decode ms a token (judged)", lambda lv, role: lv.base_ms if role == "base" else lv.pr_ms),
    )
    for ax, ylabel, values in panels:
        for role, offset, color in (("base", -0.08, "tab:blue"), ("pr", 0.08, "tab:orange")):
            label = f"{role}: {run.builds[role]['label']}"
            gx, gy, lo, hi = [], [], [], []
            for x, lv in zip(xs, verdict.levels):
                vals = values(lv, role)
                if not vals:
                    continue
                g = geomean(vals)
                gx.append(x + offset)
                gy.append(g)
                lo.append(max(0.0, g - min(vals)))  # a single sample's geomean may differ from it in the last bit
                hi.append(max(0.0, max(vals) - g))
                ax.scatter([x + offset] * len(vals), vals, s=10, color=color, alpha=0.45, zorder=3)
            if gx:
                ax.errorbar(
                    gx, gy, yerr=[lo, hi], fmt="o-", color=color, capsize=4, label=label + " (geomean, min–max)"
                )
        ax.set_xticks(xs, [str(c) for c in levels])
        ax.set_xlabel("requests in flight (--max-concurrency)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    for x, lv in zip(xs, verdict.levels):
        if lv.verdict in (IMPROVED, REGRESSED) and lv.speedup is not None and lv.pr_ms:
            axes[1].annotate(
                f"{lv.verdict} {lv.speedup:+.0%}",
                (x, max(lv.base_ms + lv.pr_ms)),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
    fig.suptitle(f"{run.builds['base']['label']} vs {run.builds['pr']['label']}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
