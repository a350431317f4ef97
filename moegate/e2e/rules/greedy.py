"""The greedy rule: two builds' greedy passes over the same prompts, token by token.

``compare`` is token equality with a divergence report (each differing prompt, the first divergent
token, both continuations from there, the top candidates with their margin); under ``--strict`` it is
the verdict. ``classify`` turns it into the batch-robust verdict of docs/design/e2e-rules.md: a divergence is
identical, explained (a near tie: each build's token in the other's top 5, both margins within the
run's tie bound) or unexplained, and only unexplained ones fail.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moegate.e2e import stats
from moegate.e2e.greedy_passes import NEAR_TIE_NATS, SHOWN_TOKENS, Completion, Decode, first_divergence
from moegate.e2e.verdict import GateResult


def _top_at(c: Completion, pos: int) -> list[tuple[int, float]]:
    return c.top[pos] if pos < len(c.top) else []


def _fmt_top(top: list[tuple[int, float]]) -> str:
    if not top:
        return "(not recorded)"
    shown = ", ".join(f"{t} ({lp:.4f})" for t, lp in top)
    if len(top) >= 2:
        margin = top[0][1] - top[1][1]
        tie = " near tie" if margin < NEAR_TIE_NATS else ""
        shown += f"; margin {margin:.4f} nats{tie}"
    return shown


def compare(
    a_label: str,
    a: Sequence[Completion],
    b_label: str,
    b: Sequence[Completion],
    *,
    gate: str,
    decode: Decode | None = None,
) -> GateResult:
    """Token-by-token equality of two passes over the same prompts, with a divergence report."""
    by_id = {c.prompt_id: c for c in b}
    diffs: list[dict[str, Any]] = []
    missing = [c.prompt_id for c in a if c.prompt_id not in by_id]
    if missing or len(a) != len(b):
        return GateResult(gate, False, f"{a_label} and {b_label} ran different prompt sets (missing: {missing[:5]})")
    for ca in a:
        cb = by_id[ca.prompt_id]
        if ca.prompt_sha256 != cb.prompt_sha256:
            diffs.append({"prompt_id": ca.prompt_id, "position": None, "reason": "different prompt text (hash)"})
            continue
        pos = first_divergence(ca.token_ids, cb.token_ids)
        if pos is None:
            continue
        d: dict[str, Any] = {
            "prompt_id": ca.prompt_id,
            "position": pos,
            a_label: ca.token_ids[pos : pos + SHOWN_TOKENS],
            b_label: cb.token_ids[pos : pos + SHOWN_TOKENS],
            f"{a_label}_top": _top_at(ca, pos),
            f"{b_label}_top": _top_at(cb, pos),
        }
        if decode is not None:
            d[f"{a_label}_text"] = decode(ca.token_ids[pos:])
            d[f"{b_label}_text"] = decode(cb.token_ids[pos:])
        diffs.append(d)
    n = len(a)
    if not diffs:
        return GateResult(gate, True, f"{n} of {n} completions token-identical ({a_label} vs {b_label})")
    lines = [
        f"| prompt | first divergent token | {a_label} from there | {b_label} from there | top candidates at that position, {a_label} | top, {b_label} |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for d in diffs:
        if d["position"] is None:
            lines.append(f"| {d['prompt_id']} | - | {d['reason']} | | | |")
            continue
        show_a = repr(d.get(f"{a_label}_text", "")[:80]) if decode else d[a_label]
        show_b = repr(d.get(f"{b_label}_text", "")[:80]) if decode else d[b_label]
        lines.append(
            f"| {d['prompt_id']} | {d['position']} | {show_a} `{d[a_label]}` | {show_b} `{d[b_label]}` "
            f"| {_fmt_top(d[f'{a_label}_top'])} | {_fmt_top(d[f'{b_label}_top'])} |"
        )
    return GateResult(
        gate,
        False,
        f"{len(diffs)} of {n} completions differ between {a_label} and {b_label}",
        "\n".join(lines),
        diffs,
    )


def classify(res: GateResult, a_label: str, b_label: str, n: int, tie: float) -> GateResult:
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
