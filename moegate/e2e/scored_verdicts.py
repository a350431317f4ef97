"""The scored phase's verdicts, without servers (rules in docs/e2e-rules.md): the scored comparison,
each greedy divergence identical, explained (near tie) or unexplained, and GSM8K's exact McNemar test
with every differing response's first divergence judged. The scores come from ``moegate/e2e/scored.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from moegate.e2e import stats
from moegate.e2e.scored import PR_SEQUENCE, ScoreData
from moegate.e2e.verdict import GateResult


def tie_bound(data: ScoreData | None) -> float:
    """The near-tie bound of this run: ``stats.tie_bound`` of its largest same-build token change."""
    return stats.tie_bound(stats.noise_max(data.seq_scores())) if data is not None and data.sequences else 0.0


def decode_noise(data: ScoreData | None, greedy_1: Mapping[str, Sequence[Any]]) -> float:
    """The largest change of one token's log-probability between decoding it and scoring it (prefill).

    Each build's 1-in-flight greedy continuation reported, token by token, the log-probability it decoded
    with (``Completion.top``); the scoring phase scored the same tokens of the same sequence in prefill.
    Same build, same tokens, another kernel schedule (one row per step against the whole sequence at
    once): the difference is noise of the build, measured in this run (docs/e2e-rules.md, GSM8K).
    """
    if data is None or not data.sequences:
        return 0.0
    worst = 0.0
    seqs = {s.seq_id: s for s in data.sequences}
    for label, completions in greedy_1.items():
        per_comp = data.scores.get(label, [])
        for c in completions:
            for sid in (c.prompt_id, c.prompt_id + PR_SEQUENCE):
                seq = seqs.get(sid)
                if seq is None or list(seq.token_ids[seq.start :]) != list(c.token_ids):
                    continue
                for scored in (m.get(sid) for m in per_comp):
                    if scored is None:
                        continue
                    for tok, top, lp in zip(c.token_ids, c.top, scored.logprobs, strict=False):
                        decoded = dict(top).get(tok)
                        if decoded is not None:
                            worst = max(worst, abs(decoded - lp))
    return worst


def gsm8k_tie_bound(data: ScoreData | None, greedy_1: Mapping[str, Sequence[Any]]) -> float:
    """GSM8K's near-tie bound: a response diverged while decoding, but its first divergent token is judged by
    re-scoring (prefill), so a margin can move by the decode-to-prefill change as well as the batch one."""
    if data is None or not data.sequences:
        return 0.0
    return stats.tie_bound(max(stats.noise_max(data.seq_scores()), decode_noise(data, greedy_1)))


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


def classify_greedy(res: GateResult, a_label: str, b_label: str, n: int, tie: float) -> GateResult:
    """A token-equality result turned into the batch-robust verdict: only unexplained divergences fail."""
    explained: list[dict[str, Any]] = []
    unexplained: list[dict[str, Any]] = []
    for d in res.differences:
        if d.get("position") is None:
            d["explained"], d["why"] = False, d.get("reason", "different prompt")
            unexplained.append(d)
            continue
        div = stats.Divergence(d[a_label][0], d[b_label][0], d[f"{a_label}_top"], d[f"{b_label}_top"])
        ok, why = div.explain(tie)
        d["explained"], d["why"] = ok, why
        (explained if ok else unexplained).append(d)
    if "different prompt sets" in res.summary:
        return res
    identical = n - len(res.differences)
    res.passed = not unexplained
    res.summary = (
        f"{identical} identical, {len(explained)} explained (near tie), {len(unexplained)} unexplained of {n} "
        f"({a_label} vs {b_label}; tie bound {tie:.4f} nats)"
    )
    if unexplained:
        res.summary += "; unexplained: " + ", ".join(
            f"{d['prompt_id']}@{d.get('position')}: {d['why']}" for d in unexplained[:5]
        )
    if res.details_markdown:
        res.details_markdown += (
            "\n"
            + "\n".join(
                f"- {d['prompt_id']} at {d.get('position')}: {'explained' if d['explained'] else 'UNEXPLAINED'}: {d['why']}"
                for d in res.differences
            )
            + "\n"
        )
    return res


def _not_judged(d: Mapping[str, Any], a: str, b: str, tie: float) -> str | None:
    """Why a re-scored divergence says nothing about either build, or None when the tie rule can judge it.

    A build's own token missing from its own re-scored top list means the re-scoring does not see what that
    build generated. That is no evidence against it when neither build's own token is in its own list (the
    re-tokenized text is neither build's generation), or when its list is flat: every listed candidate
    within the tie bound of the first, so a token just below the list can be the top one in decode. A
    missing own token under a steep list of one build only is that build computing something else than it
    generated with (a decode-only bug would look so): the tie rule then fails it."""
    off = {}
    for lab in (a, b):
        top = [(int(t), float(lp)) for t, lp in d["top"][lab][: stats.TOP_K]]
        off[lab] = (d["tokens"][lab] not in {t for t, _ in top}, bool(top) and top[0][1] - top[-1][1] <= tie)
    if not any(missing for missing, _ in off.values()):
        return None
    if all(missing for missing, _ in off.values()):
        return "neither build's own token is in its own top list: the re-tokenized responses are neither's generation"
    if all(flat for missing, flat in off.values() if missing):
        return "a build's own token is below its own top list, which lies within the tie bound of its first"
    return None


def gsm8k_result(
    labels: tuple[str, str],
    base_run: Any,
    pr_run: Any,
    repeats: Sequence[tuple[str, Any, Any]],
    divergences: Sequence[dict[str, Any]],
    tie: float,
    *,
    detect: float = stats.DETECT_GSM8K,
    cap: int,
) -> GateResult:
    """The GSM8K verdict: McNemar per filter at ALPHA_GSM8K/2 and every differing response explained."""
    a, b = labels
    reasons, parts = [], []
    em = {
        f: (
            {int(r["doc_id"]): int(r[k]) for r in base_run.records},
            {int(r["doc_id"]): int(r[k]) for r in pr_run.records},
        )
        for f, k in (("strict-match", "exact_match_strict"), ("flexible-extract", "exact_match_flexible"))
    }
    n = len(base_run.records)
    tests = {f: stats.mcnemar(*pair) for f, pair in em.items()}
    noise = []
    for _lab, r1, r2 in repeats:
        for k in ("exact_match_strict", "exact_match_flexible"):
            x = {int(r["doc_id"]): int(r[k]) for r in r1.records}
            y = {int(r["doc_id"]): int(r[k]) for r in r2.records}
            noise.append(stats.mcnemar(x, y).discordant / max(n, 1))
    psi = max([*noise, *(t.discordant / max(n, 1) for t in tests.values())], default=0.0)
    needed = stats.needed_questions(psi, detect=detect)
    resolves = stats.detectable_difference(psi, n)
    for f, t in tests.items():
        sa, sb = sum(em[f][0].values()) / max(n, 1), sum(em[f][1].values()) / max(n, 1)
        parts.append(f"{f} {sa:.4f}/{sb:.4f} (discordant {len(t.a_only)}/{len(t.b_only)}, exact McNemar p={t.p:.3g})")
        if t.p < stats.ALPHA_GSM8K / 2:
            reasons.append(f"{f}: exact_match differs, p={t.p:.3g} < {stats.ALPHA_GSM8K / 2}")
    unexplained = []
    for d in divergences:
        if "top" not in d:
            d["explained"] = bool(d.get("explained"))
            d["why"] = d.get("reason", "")
        elif (why := _not_judged(d, a, b, tie)) is not None:
            d["explained"], d["unjudged"] = True, True
            d["why"] = f"not judged by re-scoring (tokens {d['tokens'][a]}, {d['tokens'][b]}): {why}"
        else:
            div = stats.Divergence(d["tokens"][a], d["tokens"][b], [tuple(p) for p in d["top"][a]],
                                   [tuple(p) for p in d["top"][b]])  # fmt: skip
            d["explained"], d["why"] = div.explain(tie)
        if not d["explained"]:
            unexplained.append(d)
    if unexplained:
        reasons.append(
            f"{len(unexplained)} of {len(divergences)} differing responses unexplained (doc ids "
            + ", ".join(str(d["doc_id"]) for d in unexplained[:20])
            + ")"
        )
    passed = not reasons
    discordant = sorted({*(x for t in tests.values() for x in (*t.a_only, *t.b_only))})
    summary = (
        f"{'PASS' if passed else 'FAIL'}: {n} questions; "
        + "; ".join(parts)
        + f"; repeat discordance {psi:.3f}; {len(divergences)} responses differ, "
        f"{len(divergences) - len(unexplained)} explained (tie bound {tie:.4f}, decode and batch noise; "
        f"{sum(1 for d in divergences if d.get('unjudged'))} not judged by re-scoring, left to the exact test); "
        "resolves an exact_match difference "
        f"of {resolves:.3f} (promise {detect}, needs {needed} questions, cap {cap})"
    )
    if discordant:
        summary += "; discordant doc ids " + ", ".join(map(str, discordant[:30]))
    if reasons:
        summary += "; " + "; ".join(reasons)
    lines = [
        f"### GSM8K, {a} vs {b}: **{'PASS' if passed else 'FAIL'}**", "",
        *(f"- {p}" for p in parts),
        f"- discordant questions (doc ids): {', '.join(map(str, discordant)) or 'none'}",
        *(f"- doc {d['doc_id']} at token {d.get('position')}: {'explained' if d['explained'] else 'UNEXPLAINED'}: "
          f"{d['why']}" for d in divergences),
    ]  # fmt: skip
    return GateResult(
        "gsm8k", passed, summary, "\n".join(lines) + "\n",
        [{"divergences": list(divergences), "mcnemar": {f: t.__dict__ for f, t in tests.items()}}],
    )  # fmt: skip
