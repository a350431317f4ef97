"""The noise a run measures of itself, as the rules use it: tie bounds for greedy and GSM8K divergences.

Every figure here is the noise of a build the PR did not change, on sequences that are the same for both
builds whatever the PR does (docs/design/e2e-rules.md, "A tie bound that does not grow with the PR's divergence"): the
base's continuations, scored by the base under both compositions; the base's greedy passes against their repeat;
the base's own decode against its own prefill. The PR's extra continuations (``+pr`` sequences, one per prompt it
diverges on) never enter a bound: with a bug that diverges everywhere they added a sequence each, and the largest
same-build change over more sequences grew (1.03 nats against a same-build pair's 0.20 in the same call on the
H200, 2026-12-02), so the bug's divergences were explained by the bug's own noise. Nor does the PR's own noise: a
top-1 expert swapped between tokens at 2-4 tokens with host-resident weights made the PR's own repeat at 4 in
flight differ, and its decode row PASSed at 0.057 nats/token between the builds against 0.017 "within", the PR's
own instability counted as noise (2026-12-06). A PR that disagrees with itself more than the base does is a
finding of its own (``rules/repeats.py``), never a wider bound.

- ``within_max``: the base's largest change of one token between the two batch compositions (M_w);
- ``decode_repeat_max``: the largest change of one token between a build's greedy pass and its repeat (the rules
  pass the base alone);
- ``decode_noise``: the largest change of one token between decoding it and scoring it (prefill), M_d;
- ``reference_max``: the largest change the reference re-rounding makes to one token (M_R);
- ``pr_max``: under ``equivalent``, the largest change the PR makes to one token, in prefill on the base's
  sequences or in decode along the common prefix (M_P), at most the one-token bound;
- ``tie_bound``, ``gsm8k_tie_bound``: twice the relevant largest change (a margin is a difference of two
  log-probabilities, each of which that noise moves by at most the figure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from moegate.e2e import stats
from moegate.e2e.run_data import PR_SEQUENCE, BuildRun, ScoreData, decode_pairs


def within_max(data: ScoreData | None) -> float:
    """M_w: the base's largest change of one token between the two compositions, on the base's sequences only (the
    PR's own change between compositions is what the rules judge, not a tolerance they grant it)."""
    if data is None or not data.sequences:
        return 0.0
    ids = {s.seq_id for s in data.base_sequences()}
    return max((float(np.abs(s.a2 - s.a1).max()) for s in data.seq_scores() if s.seq_id in ids and s.a1.size),
               default=0.0)  # fmt: skip


def decode_repeat_max(runs: Sequence[BuildRun]) -> float:
    """The largest change of one token between a build's greedy pass and its repeat (same composition, decode)."""
    worst = 0.0
    for run in runs:
        for c, again in run.repeat.items():
            for p in decode_pairs(run.greedy.get(c, []), again):
                if p.a.size:
                    worst = max(worst, float(np.abs(p.b - p.a).max()))
    return worst


def tie_bound(data: ScoreData | None, runs: Sequence[BuildRun] = ()) -> float:
    """The near-tie bound under ``identical``: twice the largest same-build change, prefill or decode, of the base
    (``runs``: the builds whose repeats count, the base alone in ``judge``)."""
    return stats.tie_bound(max(within_max(data), decode_repeat_max(runs)))


def decode_noise(data: ScoreData | None, greedy_1: Mapping[str, Sequence[Any]]) -> float:
    """The largest change of one token's log-probability between decoding it and scoring it (prefill).

    Each build's 1-in-flight greedy continuation reported, token by token, the log-probability it decoded
    with (``Completion.top``); the scoring phase scored the same tokens of the same sequence in prefill.
    Same build, same tokens, another kernel schedule (one row per step against the whole sequence at
    once): the difference is noise of the build, measured in this run (docs/design/e2e-rules.md, GSM8K). The
    rules pass the base's continuation only: a PR whose decode alone is wrong would widen its own bound.
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


def reference_max(data: ScoreData | None, base: BuildRun | None, reference: BuildRun | None) -> float:
    """M_R: the largest change the reference re-rounding makes to one token, in prefill (the base's sequences at
    composition 1) or in decode (the base's and the reference's greedy passes along their common prefix)."""
    prefill = _prefill_max(data, data.reference) if data is not None and data.reference else 0.0
    return max(prefill, _decode_max(base, reference))


def _prefill_max(data: ScoreData | None, label: str) -> float:
    """The largest change ``label`` makes to one token of the base's sequences in prefill (composition 0)."""
    if data is None or label not in data.scores:
        return 0.0
    base = data.labels[0]
    worst = 0.0
    for s in data.base_sequences():
        a = np.asarray(data.scores[base][0][s.seq_id].logprobs)
        x = np.asarray(data.scores[label][0][s.seq_id].logprobs)
        if a.size and a.size == x.size:
            worst = max(worst, float(np.abs(x - a).max()))
    return worst


def _decode_max(base: BuildRun | None, other: BuildRun | None) -> float:
    """The largest change of one token between the base's greedy passes and ``other``'s, along their common prefix."""
    worst = 0.0
    if base is not None and other is not None:
        for c, passes in other.greedy.items():
            for p in decode_pairs(base.greedy.get(c, []), passes):
                if p.a.size:
                    worst = max(worst, float(np.abs(p.b - p.a).max()))
    return worst


def pr_max(data: ScoreData | None, base: BuildRun | None = None, pr: BuildRun | None = None) -> float:
    """M_P: the largest change the PR makes to one token, in prefill (the base's sequences, composition 0) or in
    decode (both builds' greedy passes along their common prefix).

    Under ``equivalent`` the PR may re-round the whole model, and a token it moves by M_P can flip a greedy choice
    whose margin is up to twice that: the tie bound takes it (``judge``), capped by the one-token bound. Where the PR
    moves a token more than a re-rounding may, the scored and decode clauses fail it; the tie bound only stops
    greedy from failing a re-rounding they passed. It is measured on the base's sequences and the common prefix
    only, so a PR's divergences do not add to it (docs/design/e2e-rules.md)."""
    prefill = _prefill_max(data, data.labels[1]) if data is not None and data.sequences else 0.0
    return max(prefill, _decode_max(base, pr))


def gsm8k_tie_bound(data: ScoreData | None, greedy_1: Mapping[str, Sequence[Any]], extra: float = 0.0) -> float:
    """GSM8K's near-tie bound: a response diverged while decoding, but its first divergent token is judged by
    re-scoring (prefill), so a margin can move by the decode-to-prefill change as well as the batch one (and,
    under ``equivalent``, by what a re-rounding moves one token: ``extra``)."""
    if data is None or not data.sequences:
        return 0.0
    return stats.tie_bound(max(within_max(data), decode_noise(data, greedy_1), extra))
