"""The GSM8K rule: two builds' lm-eval records compared (docs/design/e2e-rules.md, GSM8K).

- ``compare`` (and ``compare_runs``): byte identity of every response and equal exact_match under both
  filters; what ``--strict`` asks, and what a build is compared with its golden by.
- ``gsm8k_result``: the batch-robust verdict: the exact McNemar test per filter and every differing
  response's first divergence explained (judged on the re-scoring the scoring phase made).
- ``noise_row``: a build against its own repeat, the noise floor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from moegate.e2e import paired, stats
from moegate.e2e.lmeval.output import Gsm8kRun, scores_of
from moegate.e2e.lmeval.task import FILTERS, LM_EVAL_VERSION, NUM_FEWSHOT, Gsm8kError
from moegate.e2e.rules.equivalent import gsm8k_interval
from moegate.e2e.verdict import GateResult

GATE = "gsm8k"

SUMMARY_RESPONSE_CHARS = 160
"""Responses in the Markdown summary are cut here; the JSON differences keep them whole."""


# --- comparison ------------------------------------------------------------------


def _cut(text: str | None, n: int = SUMMARY_RESPONSE_CHARS) -> str:
    if text is None:
        return "(absent)"
    return text if len(text) <= n else text[:n] + f"… (+{len(text) - n} chars)"


def _fmt(score: float) -> str:
    return "n/a" if math.isnan(score) else f"{score:.4f}"


def compare(
    base_records: Sequence[Mapping[str, Any]],
    pr_records: Sequence[Mapping[str, Any]],
    *,
    labels: tuple[str, str] = ("base", "pr"),
    gate: str = GATE,
    base_scores: Mapping[str, float] | None = None,
    pr_scores: Mapping[str, float] | None = None,
) -> GateResult:
    """PASS when both sides score the same under both filters and every response is byte-identical.

    The same function compares a build against its golden (``labels=("golden", "pr")``).
    Scores default to those computed from the records (equal to lm-eval's, which
    ``read_run`` checks). Every difference names the doc id and carries both full responses.
    """
    a_label, b_label = labels
    a = {int(r["doc_id"]): r for r in base_records}
    b = {int(r["doc_id"]): r for r in pr_records}
    sa = dict(base_scores) if base_scores is not None else scores_of(list(a.values()))
    sb = dict(pr_scores) if pr_scores is not None else scores_of(list(b.values()))
    diffs: list[dict[str, Any]] = []
    for doc_id in sorted(a.keys() | b.keys()):
        ra, rb = a.get(doc_id), b.get(doc_id)
        if ra is None or rb is None:
            diffs.append(
                {"doc_id": doc_id, "kind": "missing", a_label: ra and ra["response"], b_label: rb and rb["response"],
                 "missing_in": a_label if ra is None else b_label}
            )  # fmt: skip
            continue
        kinds = []
        if ra.get("question_sha256") != rb.get("question_sha256"):
            kinds.append("question")
        if ra.get("prompt_sha256") and rb.get("prompt_sha256") and ra["prompt_sha256"] != rb["prompt_sha256"]:
            kinds.append("prompt")
        if ra["response"] != rb["response"]:
            kinds.append("response")
        if kinds:
            diffs.append(
                {
                    "doc_id": doc_id,
                    "kind": "+".join(kinds),
                    a_label: ra["response"],
                    b_label: rb["response"],
                    f"{a_label}_strict": ra.get("strict"),
                    f"{b_label}_strict": rb.get("strict"),
                    f"{a_label}_flexible": ra.get("flexible"),
                    f"{b_label}_flexible": rb.get("flexible"),
                    f"{a_label}_exact_match": [ra.get("exact_match_strict"), ra.get("exact_match_flexible")],
                    f"{b_label}_exact_match": [rb.get("exact_match_strict"), rb.get("exact_match_flexible")],
                }
            )
    score_diff = [f for f in FILTERS if sa.get(f) != sb.get(f)]
    passed = not diffs and not score_diff
    n = len(a.keys() | b.keys())
    parts = [f"{n} questions"]
    parts.append(
        "exact_match " + ", ".join(
            f"{f} {_fmt(sa[f])}" if f not in score_diff else f"{f} {a_label} {_fmt(sa[f])} != {b_label} {_fmt(sb[f])}"
            for f in FILTERS
        )
    )  # fmt: skip
    parts.append("all responses byte-identical" if not diffs else f"{len(diffs)} differ: doc ids " + _ids(diffs))
    summary = f"{gate} {a_label} vs {b_label}: {'PASS' if passed else 'FAIL'}: " + "; ".join(parts)
    return GateResult(gate, passed, summary, render_markdown(gate, passed, labels, sa, sb, n, diffs), diffs)


def _ids(diffs: Sequence[Mapping[str, Any]], most: int = 20) -> str:
    ids = [str(d["doc_id"]) for d in diffs]
    return ", ".join(ids[:most]) + (f" … (+{len(ids) - most})" if len(ids) > most else "")


def first_difference(a: str | None, b: str | None) -> int:
    """The index of the first character where two responses differ (the shorter length if one is a prefix)."""
    a, b = a or "", b or ""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _excerpt(text: str | None, start: int) -> str:
    """``text`` from ``start`` (a little before the first difference), cut at ``SUMMARY_RESPONSE_CHARS``."""
    if text is None:
        return "(absent)"
    head = f"…({start} chars) " if start > 0 else ""
    return head + _cut(text[start:])


def _code(text: str) -> str:
    body = text.replace("```", "`\u200b``")
    return f"```text\n{body}\n```"


def render_markdown(
    gate: str,
    passed: bool,
    labels: tuple[str, str],
    scores_a: Mapping[str, float],
    scores_b: Mapping[str, float],
    questions: int,
    diffs: Sequence[Mapping[str, Any]],
    *,
    most: int = 10,
) -> str:
    """The gate's section of a result page: verdict, scores side by side, the first differing questions."""
    a_label, b_label = labels
    lines = [
        f"### GSM8K ({gate}): {a_label} vs {b_label}: **{'PASS' if passed else 'FAIL'}**",
        "",
        f"{questions} questions, {NUM_FEWSHOT}-shot, greedy (lm-eval {LM_EVAL_VERSION}, `local-completions`).",
        "",
        f"| exact_match | {a_label} | {b_label} |",
        "| --- | ---: | ---: |",
        *(f"| {f} | {_fmt(scores_a[f])} | {_fmt(scores_b[f])} |" for f in FILTERS),
        "",
    ]
    if not diffs:
        lines.append("Every response byte-identical.")
        return "\n".join(lines) + "\n"
    lines.append(f"{len(diffs)} question(s) differ: doc ids {_ids(diffs, 50)}.")
    lines.append(
        f"Each pair is shown from shortly before its first difference, cut at {SUMMARY_RESPONSE_CHARS} characters;"
        " the JSON differences keep the responses whole."
    )
    for d in diffs[:most]:
        ra, rb = d.get(a_label), d.get(b_label)
        at = first_difference(ra, rb)
        start = max(0, at - 40)
        lines += [
            "",
            (
                f"**doc {d['doc_id']}** ({d['kind']}): responses differ from character {at};"
                f" strict {d.get(f'{a_label}_strict')!r} / {d.get(f'{b_label}_strict')!r},"
                f" flexible {d.get(f'{a_label}_flexible')!r} / {d.get(f'{b_label}_flexible')!r}"
            ),
            "",
            f"{a_label}:",
            _code(_excerpt(ra, start)),
            f"{b_label}:",
            _code(_excerpt(rb, start)),
        ]
    if len(diffs) > most:
        lines += ["", f"… and {len(diffs) - most} more in the JSON differences."]
    return "\n".join(lines) + "\n"


def compare_runs(base: Gsm8kRun, pr: Gsm8kRun, labels: tuple[str, str] = ("base", "pr")) -> GateResult:
    """Two runs of the gate, compared on lm-eval's own aggregate scores and every response."""
    if base.task != pr.task or base.limit != pr.limit:
        raise Gsm8kError(f"runs differ in task or size: {base.task}/{base.limit} against {pr.task}/{pr.limit}")
    return compare(base.records, pr.records, labels=labels, base_scores=base.scores, pr_scores=pr.scores)


# --- the batch-robust verdict ---------------------------------------------------------


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
    detect: float = paired.DETECT_GSM8K,
    cap: int,
    promise: str = "identical",
) -> GateResult:
    """The GSM8K verdict: McNemar per filter at ALPHA_GSM8K/2 and every differing response explained; under
    ``equivalent`` also the exact_match difference's interval inside ``+-detect`` (``equivalent.gsm8k_interval``)."""
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
    tests = {f: paired.mcnemar(*pair) for f, pair in em.items()}
    noise = []
    for _lab, r1, r2 in repeats:
        for k in ("exact_match_strict", "exact_match_flexible"):
            x = {int(r["doc_id"]): int(r[k]) for r in r1.records}
            y = {int(r["doc_id"]): int(r[k]) for r in r2.records}
            noise.append(paired.mcnemar(x, y).discordant / max(n, 1))
    psi = max([*noise, *(t.discordant / max(n, 1) for t in tests.values())], default=0.0)
    needed = paired.needed_questions(psi, detect=detect)
    resolves = paired.detectable_difference(psi, n)
    for f, t in tests.items():
        sa, sb = sum(em[f][0].values()) / max(n, 1), sum(em[f][1].values()) / max(n, 1)
        parts.append(f"{f} {sa:.4f}/{sb:.4f} (discordant {len(t.a_only)}/{len(t.b_only)}, exact McNemar p={t.p:.3g})")
        if t.p < paired.ALPHA_GSM8K / 2:
            reasons.append(f"{f}: exact_match differs, p={t.p:.3g} < {paired.ALPHA_GSM8K / 2}")
        if promise == "equivalent":
            lo, hi = gsm8k_interval(*em[f], alpha=paired.ALPHA_GSM8K / 4)
            parts[-1] += f", difference in [{lo:+.3f}, {hi:+.3f}]"
            if lo <= -detect or hi >= detect:
                reasons.append(f"{f}: exact_match difference [{lo:+.3f}, {hi:+.3f}] not shown inside +-{detect}")
    unexplained, sides = [], []
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
            if not d["explained"] and (side := div.against(tie)) is not None:
                d["explained"], d["against"] = True, (a, b)[side == "b"]
                d["why"] += f"; beyond the bound, the re-scorings agree: {d['against']} decoded what both rank lower"
                sides.append(side)
        if not d["explained"]:
            unexplained.append(d)
    if unexplained:
        reasons.append(
            f"{len(unexplained)} of {len(divergences)} differing responses unexplained (doc ids "
            + ", ".join(str(d["doc_id"]) for d in unexplained[:20])
            + ")"
        )
    pr_side = sides.count("b")
    sign_p = stats.sign_test_greater(pr_side, len(sides))
    if sign_p < paired.ALPHA_GSM8K / 2:
        reasons.append(
            f"the PR decoded the token both re-scorings rank lower in {pr_side} of {len(sides)} flips beyond the"
            f" tie bound, sign test p={sign_p:.3g} < {paired.ALPHA_GSM8K / 2}"
        )
    passed = not reasons
    discordant = sorted({*(x for t in tests.values() for x in (*t.a_only, *t.b_only))})
    summary = (
        f"{'PASS' if passed else 'FAIL'} ({promise}): {n} questions; "
        + "; ".join(parts)
        + f"; repeat discordance {psi:.3f}; {len(divergences)} responses differ, "
        f"{len(divergences) - len(unexplained)} explained (tie bound {tie:.4f}, decode and batch noise; "
        f"{sum(1 for d in divergences if d.get('unjudged'))} not judged by re-scoring, left to the exact test; "
        f"{len(sides)} beyond the bound with both re-scorings agreeing, the PR's token ranked lower in {pr_side}, "
        f"sign test p={sign_p:.3g}); "
        "resolves an exact_match difference "
        f"of {resolves:.3f} (promise {detect}, needs {needed} questions, cap {cap})"
    )
    if discordant:
        summary += "; discordant doc ids " + ", ".join(map(str, discordant[:30]))
    if reasons:
        summary += "; " + "; ".join(reasons)
    lines = [
        f"### GSM8K ({promise}), {a} vs {b}: **{'PASS' if passed else 'FAIL'}**", "",
        *(f"- {p}" for p in parts),
        f"- discordant questions (doc ids): {', '.join(map(str, discordant)) or 'none'}",
        *(f"- doc {d['doc_id']} at token {d.get('position')}: {'explained' if d['explained'] else 'UNEXPLAINED'}: "
          f"{d['why']}" for d in divergences),
    ]  # fmt: skip
    return GateResult(
        f"gsm8k ({promise})", passed, summary, "\n".join(lines) + "\n",
        [{"divergences": list(divergences), "mcnemar": {f: t.__dict__ for f, t in tests.items()}}],
    )  # fmt: skip


def noise_row(label: str, r1: Any, r2: Any) -> GateResult:
    """A build against its own repeat: the GSM8K noise floor; fails only if the build disagrees with itself one way."""
    parts, bad = [], []
    for f, k in (("strict-match", "exact_match_strict"), ("flexible-extract", "exact_match_flexible")):
        t = paired.mcnemar(
            {int(r["doc_id"]): int(r[k]) for r in r1.records}, {int(r["doc_id"]): int(r[k]) for r in r2.records}
        )
        parts.append(f"{f} discordant {len(t.a_only)}/{len(t.b_only)} p={t.p:.3g}")
        if t.p < paired.ALPHA_GSM8K / 2:
            bad.append(f)
    differ = sum(1 for x, y in zip(r1.records, r2.records, strict=False) if x["response"] != y["response"])
    ok = not bad
    return GateResult(
        f"gsm8k, {label} twice", ok,
        f"{'PASS' if ok else 'FAIL'}: noise floor: {differ} of {len(r1.records)} responses differ; " + "; ".join(parts),
    )  # fmt: skip
