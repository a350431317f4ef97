"""The noise a run measures of itself, as the rules use it: tie bounds for greedy and GSM8K divergences.

- ``tie_bound``: twice the largest same-build change of one token between the two batch compositions;
- ``decode_noise``: the largest change of one token between decoding it and scoring it (prefill);
- ``gsm8k_tie_bound``: twice the larger of the two (a GSM8K divergence happens in decode and is judged by
  a re-scoring). Derivations: docs/e2e-rules.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from moegate.e2e import stats
from moegate.e2e.data import PR_SEQUENCE, ScoreData


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
