"""The ``identical`` promise's rules (docs/design/e2e-rules.md): the PR computes what the base computes at the same
batch composition.

- ``scored_result``: both builds' log-probabilities of the same sequences (prefill), each build under two
  batch compositions; FAIL on a systematic shift, a wider spread between builds than within one, or one
  token moved past a bound of the run's own noise (``stats.decide``);
- ``decode_result``: the decode path, where the change under test acts: both builds' log-probabilities of
  the tokens both generated, at 1 and at 4 in flight, against the base's own repeat (the PR's own repeat is
  ``rules/repeats.py``'s to judge, never this rule's noise).

The scores come from the scoring phase (``moegate/e2e/scoring_phase.py``), the decoded log-probabilities from the
greedy passes (``moegate/e2e/greedy_passes.py``).

- ``starts_caveat``: the note a run gets where its servers ran with torch.compile and CUDA graphs: there two starts
  of one build need not compute the same, which the rules' "within" (a server's own repeat) cannot see.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from moegate.e2e import stats
from moegate.e2e.rules.noise import within_max
from moegate.e2e.run_data import BuildRun, DecodePair, ScoreData, decode_pairs
from moegate.e2e.verdict import GateResult


def starts_caveat(flags: Mapping[str, Sequence[str]]) -> str | None:
    """A note for ``identical`` judged on servers that were not eager, else None.

    On the H200, 25 starts of one 0.33.0 build with torch.compile and CUDA graphs on fell into 4 classes of
    bit-identical output, and two starts agreed about one time in three; eager starts agreed
    (results/e2e-promises-h200.md, "The panel of 2026-12-03 (2)"; docs/design/e2e-rules.md, "Two starts of one build").
    A FAIL there may be the two starts', not the PR's: the note says so and what to do, the verdict stands.
    """
    compiled = sorted(label for label, f in flags.items() if "--enforce-eager" not in f)
    if not compiled:
        return None
    return (
        f"identical was judged on servers with torch.compile and CUDA graphs on ({', '.join(compiled)}: no "
        "--enforce-eager). There two starts of one build can compute differently (measured on the H200: "
        "results/e2e-promises-h200.md), and a server's own repeat, the rules' within, cannot see it: a FAIL may be "
        "the starts', not the PR's. "
        "Serve with --enforce-eager for this promise (the gate's e2e leg does), or judge --promise equivalent "
        '(docs/design/e2e-rules.md, "Two starts of one build").'
    )


def scored_result(data: ScoreData, detect: float = stats.DETECT_NATS_PER_TOKEN) -> GateResult:
    a, b = data.labels
    gate = f"scored, {a} vs {b}"
    seqs = data.seq_scores()
    v = stats.decide(seqs, detect=detect, m_within=within_max(data))
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
            f"under two batch compositions ({'; '.join(c.name for c in data.compositions)}). Rule: docs/design/e2e-rules.md."
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


# --- the decode path -------------------------------------------------------------------------


def _mean_abs(pairs: Sequence[DecodePair]) -> dict[str, float]:
    return {p.prompt_id: float(np.abs(p.b - p.a).mean()) for p in pairs if p.a.size}


def decode_within(runs: Sequence[BuildRun]) -> tuple[int | None, dict[str, float]]:
    """Each of ``runs`` against its own repeat at the largest in-flight count that has one: per prompt, the mean
    change of one token's decoded log-probability, averaged over them (the decode clause passes the base alone)."""
    counts = sorted({c for r in runs for c in r.repeat})
    if not counts:
        return None, {}
    c = counts[-1]
    per: dict[str, list[float]] = {}
    for r in runs:
        if c in r.repeat:
            for pid, v in _mean_abs(decode_pairs(r.greedy[c], r.repeat[c])).items():
                per.setdefault(pid, []).append(v)
    return c, {pid: float(np.mean(v)) for pid, v in per.items()}


def decode_result(base: BuildRun, pr: BuildRun, c: int) -> GateResult:
    """The decode path under ``identical``: the two builds' log-probabilities of the tokens both generated at ``c``
    in flight (decode steps of at most ``c`` tokens, the naive region at 1 and 4 in flight on the tiny models),
    token by token, against the base's own repeat.

    The noise twin is the base's alone, the build the PR did not change. It was each build's (averaged) until a PR
    whose bug made its own repeat differ (a top-1 expert swapped between tokens at 2-4 tokens) PASSed this row at
    0.057 nats/token between the builds against 0.017 within on the H200 (2026-12-06): a PR must not widen its own
    tolerance. Under the null the base's repeat is a draw of the same noise as the PR's, so the twin keeps its
    meaning; where the PR disagrees with itself more than the base does, ``rules/repeats.py`` fails it on a row
    of its own.

    Per prompt with a common prefix, the between-build mean change of one token minus the same-build one; FAIL
    when the signed-rank test finds the builds further apart than each is from itself (one-sided,
    ``stats.ALPHA_SPREAD``), or, at 1 in flight where each build repeats itself bit for bit (no noise to hide
    in), when any decoded token changed between them. At an in-flight count without a repeat (1: a batch of one, which the H200 and the CPU
    both decoded bit-identically across servers of one build) the twin is the repeat at the largest count: a
    larger batch reorders more, so the test is conservative there.
    """
    a, b = base.build.label, pr.build.label
    gate = f"decode, {c} in flight"
    pairs = decode_pairs(base.greedy.get(c, []), pr.greedy.get(c, []))
    between = _mean_abs(pairs)
    twin_c, within = decode_within((base,))
    ids = sorted(between)
    if not ids:
        return GateResult(
            gate, True, f"PASS: no common prefix at {c} in flight to compare (greedy judges the divergences)"
        )
    diffs = np.array([between[i] - within.get(i, 0.0) for i in ids])
    p = stats.signed_rank_p(diffs, alternative="greater")
    tokens = sum(p_.a.size for p_ in pairs)
    largest = max((float(np.abs(x.b - x.a).max()) for x in pairs if x.a.size), default=0.0)
    # a batch of one, from a base that repeats itself bit for bit, leaves no noise for a difference to hide in:
    # any changed token is the PR computing something else, however few prompts show it. Only at 1 in flight: at 4
    # the H200's servers of one build differed in 1 % of tokens while each repeated itself exactly (a start's own
    # numerics), and at 1 in flight they never differed (13 pairs, results/e2e-equivalent.md)
    exact = c == 1 and not any(within.values())
    moved = sum(int((x.a != x.b).sum()) for x in pairs)
    passed = p >= stats.ALPHA_SPREAD and not (exact and moved)
    twin = f"{a}'s repeat at {twin_c} in flight" if twin_c is not None else "no repeat (0)"
    summary = (
        f"{'PASS' if passed else 'FAIL'}: {tokens} decoded tokens of {len(ids)} prompts both builds generated; "
        f"mean |change| {np.mean([between[i] for i in ids]):.5f} between vs {np.mean([within.get(i, 0.0) for i in ids]):.5f} "
        f"within ({twin}) nats/token, wider in {int((diffs > 0).sum())} of {len(ids)} prompts, signed-rank "
        f"p={p:.3g} (level {stats.ALPHA_SPREAD}); largest token change {largest:.4f} nats ({a} vs {b})"
    )
    if exact and moved:
        summary += f"; {a} decodes bit for bit against itself, and {moved} decoded tokens changed between the builds"
    lines = [f"### decode path, {c} in flight, {a} vs {b}: **{'PASS' if passed else 'FAIL'}**", "",
             "| prompt | tokens | mean change between | within |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for x in sorted(pairs, key=lambda x: -between.get(x.prompt_id, 0.0))[:8]:
        if x.a.size:
            lines.append(
                f"| {x.prompt_id} | {x.a.size} | {between[x.prompt_id]:.5f} | {within.get(x.prompt_id, 0.0):.5f} |"
            )
    return GateResult(
        gate, passed, summary, "\n".join(lines) + "\n",
        [{"decode": {"in_flight": c, "tokens": tokens, "prompts": len(ids), "p": p, "largest": largest}}],
    )  # fmt: skip
