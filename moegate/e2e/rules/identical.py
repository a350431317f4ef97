"""The scored comparison's rule (docs/e2e-rules.md): both builds' log-probabilities of the same sequences,
each build under two batch compositions; FAIL on a systematic shift, a wider spread between builds than
within one, or one token moved past a bound of the run's own noise (``stats.decide``).
The scores come from the scoring phase, ``moegate/e2e/scored.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from moegate.e2e import stats
from moegate.e2e.data import ScoreData
from moegate.e2e.verdict import GateResult


def scored_result(data: ScoreData, detect: float = stats.DETECT_NATS_PER_TOKEN) -> GateResult:
    a, b = data.labels
    gate = f"scored, {a} vs {b}"
    seqs = data.seq_scores()
    v = stats.decide(seqs, detect=detect)
    size = (
        f"{data.prompts_used} prompts (needs {v.needed} to resolve {detect} nats/token at power {stats.POWER}; "
        f"cap {data.cap})"
    )
    short = ""
    if v.needed > data.prompts_used:
        short = (
            f"; noise too wide for the promise at the cap: resolves about "
            f"{detect * math.sqrt(v.needed / max(data.prompts_used, 1)):.4f} nats/token"
        )
    summary = f"{'PASS' if v.passed else 'FAIL'}: {v.summary()}; {size}{short}"
    if v.reasons:
        summary += "; " + "; ".join(v.reasons)
    lines = [
        f"### scored comparison, {a} vs {b}: **{'PASS' if v.passed else 'FAIL'}**",
        "",
        (
            f"Each build scored the same {v.sequences} sequences ({v.tokens} tokens: prompt + greedy continuation) "
            f"under two batch compositions ({'; '.join(c.name for c in data.compositions)}). Rule: docs/e2e-rules.md."
        ),
        "",
        "| statistic | value | bound |",
        "| --- | ---: | ---: |",
        f"| mean shift {b} - {a}, nats/sequence | {v.shift_mean:+.5f} | signed-rank p={v.p_shift:.3g} >= {stats.ALPHA_SHIFT} |",
        f"| same build against itself, nats/sequence | {v.self_shift_range[0]:+.5f} .. {v.self_shift_range[1]:+.5f} | - |",
        (
            f"| mean |change| per token, between / within | {v.spread_between:.5f} / {v.spread_within:.5f} "
            f"| signed-rank p={v.p_spread:.3g} >= {stats.ALPHA_SPREAD} |"
        ),
        (
            f"| largest token change between builds, nats | {v.max_between:.4f} | <= {v.token_bound:.3f} "
            f"(4 x same-build max {v.noise_max:.4f}, at least {stats.TOKEN_FLOOR}) |"
        ),
        f"| sequences | {v.sequences} | needs {v.needed} prompts (cap {data.cap}) |",
        "",
    ]
    if not v.passed:
        lines += _evidence(data, seqs)
    return GateResult(
        gate, v.passed, summary, "\n".join(lines) + "\n", [{"verdict": v.__dict__, "rounds": data.rounds}]
    )


def _evidence(data: ScoreData, seqs: Sequence[stats.SeqScores], most: int = 5) -> list[str]:
    """The sequences that moved most, each with its worst token and both builds' top candidates there."""
    a, b = data.labels
    lines = [f"| sequence | shift (nats) | worst token | {a} logprob | {b} logprob | {a} top | {b} top |",
             "| --- | ---: | ---: | ---: | ---: | --- | --- |"]  # fmt: skip
    for s in sorted(seqs, key=lambda s: -abs(s.shift()))[:most]:
        _, i = s.max_between()
        ta = data.scores[a][0][s.seq_id].top[i] if i >= 0 else []
        tb = data.scores[b][0][s.seq_id].top[i] if i >= 0 else []
        fmt = lambda top: ", ".join(f"{t} ({lp:.3f})" for t, lp in top[:3])
        lines.append(f"| {s.seq_id} | {s.shift():+.4f} | {i} | {s.a1[i]:.4f} | {s.b1[i]:.4f} | {fmt(ta)} | {fmt(tb)} |")
    return [*lines, ""]
