"""The scoring phase: both builds score the same token sequences (issue 18; rules in docs/design/e2e-rules.md).

While both builds' servers run (each started once, every gate served by that start):

1. the sequences: each greedy prompt (tokenized by the base server) followed by the base
   build's greedy continuation at 1 in flight, and by the PR's where it differs;
2. each build scores every sequence under two batch compositions
   (``moegate/e2e/teacher_forced.py``): four scorings per sequence, two of them the builds'
   own noise floor;
3. ``stats.decide`` gives the verdict; when the noise is too wide for the sequences at
   hand to resolve the promised shift, more prompts of the committed set are generated
   and scored, up to a stated cap, and the rule decides on all of them;
4. each GSM8K response that differs between the builds is re-tokenized by the server,
   and its first divergent token re-scored by both servers (the context up to it plus
   the token): the near-tie rule judges it with the noise bound of step 2.

Afterwards, without servers, the rules of ``moegate/e2e/rules/`` turn the scores and the
greedy and GSM8K comparisons into verdicts; the data is kept in ``moegate/e2e/run_data.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from moegate.core import progress
from moegate.e2e import greedy_passes, stats, teacher_forced
from moegate.e2e.greedy_passes import Completion
from moegate.e2e.lmeval import parse_samples
from moegate.e2e.prompts import Prompt
from moegate.e2e.run_data import PR_SEQUENCE, SCORE_CAP_FACTOR, ScoreData
from moegate.e2e.teacher_forced import Composition, Scored, TokenSeq

ROUNDS = 3
"""At most this many extensions: each one re-estimates the noise and the size it needs."""


def compositions(in_flight: Sequence[int]) -> list[Composition]:
    waves = max(max(in_flight, default=4), 2)
    return [Composition(f"waves of {waves}, in order", waves), Composition("one at a time, reversed", 1, reverse=True)]


class _Side:
    """One build's running server, as the scoring phase needs it."""

    def __init__(self, label: str, srv: Any) -> None:
        self.label, self.srv = label, srv

    def score(self, seqs: Sequence[TokenSeq], comp: Composition, timeout_s: float) -> dict[str, Scored]:
        return teacher_forced.score(
            self.srv.url, self.srv.model_name, seqs, comp, label=self.label, timeout_s=timeout_s,
            check_alive=lambda: self.srv.check_alive(grace_s=5), log_tail=self.srv.log_tail,
        )  # fmt: skip

    def tokenize(self, text: str, special: bool) -> list[int]:
        try:
            return teacher_forced.tokenize(
                self.srv.url, self.srv.model_name, text, add_special_tokens=special, label=self.label
            )
        except teacher_forced.ScoringError:
            self.srv.check_alive(grace_s=5)
            raise

    def generate(self, prompts: Sequence[Prompt], max_tokens: int) -> list[Completion]:
        return greedy_passes.run_pass(
            self.srv.url, self.srv.model_name, prompts, 1, max_tokens=max_tokens,
            check_alive=lambda: self.srv.check_alive(grace_s=5),
        )  # fmt: skip


def _sequences(
    base: _Side, prompts: Sequence[Prompt], a: Sequence[Completion], b: Sequence[Completion]
) -> list[TokenSeq]:
    by_id = {c.prompt_id: c for c in b}
    out = []
    for p, ca in zip(prompts, a, strict=True):
        ids = base.tokenize(p.text, True)
        out.append(TokenSeq(p.id, tuple(ids + ca.token_ids), len(ids)))
        cb = by_id.get(p.id)
        if cb is not None and cb.token_ids != ca.token_ids:
            out.append(TokenSeq(p.id + PR_SEQUENCE, tuple(ids + cb.token_ids), len(ids)))
    return out


def measure(
    servers: Sequence[Any],
    labels: tuple[str, str],
    greedy_1: tuple[Sequence[Completion], Sequence[Completion]],
    prompts: Sequence[Prompt],
    *,
    all_prompts: Callable[[int], Sequence[Prompt]],
    available: int,
    in_flight: Sequence[int],
    max_tokens: int,
    detect: float = stats.DETECT_NATS_PER_TOKEN,
    cap: int | None = None,
    timeout_s: float = teacher_forced.SCORE_TIMEOUT_S,
    reference: tuple[str, Any] | None = None,
    needed: Callable[[ScoreData], int] | None = None,
) -> ScoreData:
    """Steps 1-3 of the module docstring, against two running servers (base first).

    ``reference`` (label, server): the base re-rounded, which scores the base's sequences once (composition 1),
    the yardstick of ``equivalent``. ``needed``: how many prompts the rules need on the data so far (default:
    the scored comparison's size rule, ``stats.decide``)."""
    t0 = time.monotonic()
    sides = [_Side(lab, s) for lab, s in zip(labels, servers, strict=True)]
    data = ScoreData(labels, compositions=compositions(in_flight))
    data.cap = min(available, cap if cap is not None else SCORE_CAP_FACTOR * len(prompts))
    data.scores = {lab: [{} for _ in data.compositions] for lab in labels}
    ref_side = None
    if reference is not None:
        ref_side = _Side(reference[0], reference[1])
        data.reference = reference[0]
        data.scores[reference[0]] = [{}]
    batch_prompts, batch_a, batch_b = list(prompts), list(greedy_1[0]), list(greedy_1[1])
    used = len(prompts)
    for rnd in range(ROUNDS + 1):
        new = _sequences(sides[0], batch_prompts, batch_a, batch_b)
        steps = 2 * len(data.compositions) + (ref_side is not None)
        with progress.stage(f"scored: {len(new)} sequences", steps, prefix="e2e") as bar:
            for side in sides:
                for k, comp in enumerate(data.compositions):
                    data.scores[side.label][k].update(side.score(new, comp, timeout_s))
                    bar.advance()
            if ref_side is not None:
                mine = [q for q in new if not q.seq_id.endswith(PR_SEQUENCE)]
                data.scores[ref_side.label][0].update(ref_side.score(mine, data.compositions[0], timeout_s))
                bar.advance()
        data.sequences += new
        need = needed(data) if needed is not None else stats.decide(data.seq_scores(), detect=detect).needed
        data.rounds.append({"prompts": used, "sequences": len(data.sequences), "needed_prompts": need})
        if need <= used or used >= data.cap or rnd == ROUNDS:
            break
        more = min(need, data.cap)
        batch_prompts = list(all_prompts(more))[used:more]
        batch_a = sides[0].generate(batch_prompts, max_tokens)
        batch_b = sides[1].generate(batch_prompts, max_tokens)
        used = more
    data.prompts_used = used
    data.seconds = time.monotonic() - t0
    return data


def rescore_gsm8k(
    servers: Sequence[Any],
    labels: tuple[str, str],
    base_run: Any,
    pr_run: Any,
    timeout_s: float = teacher_forced.SCORE_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """Step 4: every GSM8K question whose responses differ, its first divergent token scored by both servers."""
    sides = [_Side(lab, s) for lab, s in zip(labels, servers, strict=True)]
    a = {int(r["doc_id"]): r for r in base_run.records}
    b = {int(r["doc_id"]): r for r in pr_run.records}
    differing = sorted(d for d in a.keys() & b.keys() if a[d]["response"] != b[d]["response"])
    if not differing:
        return []

    def decoded(doc: int) -> tuple[list[int], list[int], list[int]] | None:
        """Prompt and both responses as the servers decoded them (recorded on the way to lm-eval), if both were."""
        da, db = base_run.decoded.get(doc), pr_run.decoded.get(doc)
        if da is None or db is None or da["prompt_ids"] != db["prompt_ids"]:
            return None
        return list(da["prompt_ids"]), list(da["ids"]), list(db["ids"])

    recorded = {doc: decoded(doc) for doc in differing}
    prompts_text: dict[int, str] = {}  # the texts, only where a question has no record
    if base_run.samples_path is not None and None in recorded.values():
        with open(base_run.samples_path, encoding="utf-8") as fh:
            prompts_text = {d: s["prompt"] for d, s in parse_samples(fh).items()}
    out: list[dict[str, Any]] = []
    # One line in the leg's log: on the H200 rehearsal (results/gate-rehearsal-h200.md) this step, silent until then,
    # held a same-build e2e leg past its measurement by more than 150 s (93 differing responses).
    # Each server gets one request at a time (the composition the rule was calibrated on); two servers are asked at
    # once, so the step waits for the slower of them instead of both in turn. One server behind both sides is asked
    # in turn: two requests at once would batch together and change its numbers.
    at_once = len({side.srv.url for side in sides}) == len(sides)
    with (
        ThreadPoolExecutor(len(sides) if at_once else 1) as pool,
        progress.stage(f"GSM8K re-scoring: {len(recorded)} differing responses", len(recorded), prefix="e2e") as bar,
    ):
        for doc, ids in recorded.items():
            out.append(_rescore_one(doc, ids, sides, labels, a, b, prompts_text, timeout_s, pool))
            bar.advance()
    return out


def _rescore_one(
    doc: int,
    ids: tuple[list[int], list[int], list[int]] | None,
    sides: Sequence[_Side],
    labels: tuple[str, str],
    a: dict[int, Any],
    b: dict[int, Any],
    prompts_text: dict[int, str],
    timeout_s: float,
    pool: ThreadPoolExecutor,
) -> dict[str, Any]:
    """One differing GSM8K response: its first divergent token scored by both servers, through ``pool`` (as many
    workers as servers asked at once)."""
    if ids is not None:  # the divergence as it happened
        context, (ctx, ra, rb) = "decoded", ids
    elif doc not in prompts_text:
        return {"doc_id": doc, "explained": False, "reason": "the prompt text is not in the base run's samples"}
    else:  # no record (an older run's folder): the texts re-tokenized, which can merge decoded tokens
        context = "re-tokenized"
        ctx = sides[0].tokenize(prompts_text[doc], True)
        ra = sides[0].tokenize(a[doc]["response"], False)
        rb = sides[0].tokenize(b[doc]["response"], False)
    pos = greedy_passes.first_divergence(ra, rb)
    if pos is None:  # equal token for token: the texts differ only in a way the tokenizer folds
        return {"doc_id": doc, "explained": True, "position": None, "context": context,
                "reason": f"token-identical ({context})"}  # fmt: skip
    prefix = ctx + ra[:pos]
    probe = ra[pos] if pos < len(ra) else rb[pos]
    seq = TokenSeq(f"gsm8k-{doc}", tuple(prefix + [probe]), len(prefix))

    def top(side: _Side) -> list[tuple[int, float]]:
        return side.score([seq], Composition("one", 1), timeout_s)[seq.seq_id].top[0]

    tops = list(pool.map(top, sides))
    a_tok = ra[pos] if pos < len(ra) else tops[0][0][0]
    b_tok = rb[pos] if pos < len(rb) else tops[1][0][0]
    return {
        "doc_id": doc, "position": pos, "context_tokens": len(ctx), "context": context,
        "tokens": {labels[0]: a_tok, labels[1]: b_tok},
        "ended": [lab for lab, r in zip(labels, (ra, rb), strict=True) if pos >= len(r)],
        "top": {labels[0]: tops[0], labels[1]: tops[1]},
    }  # fmt: skip
