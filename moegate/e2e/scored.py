"""The scored comparison and the batch-robust greedy and GSM8K verdicts (issue 18; rules in docs/e2e-rules.md).

While both builds' servers run (each started once, every gate served by that start):

1. the sequences: each greedy prompt (tokenized by the base server) followed by the base
   build's greedy continuation at 1 in flight, and by the PR's where it differs;
2. each build scores every sequence under two batch compositions
   (``moegate/e2e/scoring.py``): four scorings per sequence, two of them the builds'
   own noise floor;
3. ``stats.decide`` gives the verdict; when the noise is too wide for the sequences at
   hand to resolve the promised shift, more prompts of the committed set are generated
   and scored, up to a stated cap, and the rule decides on all of them;
4. each GSM8K response that differs between the builds is re-tokenized by the server,
   and its first divergent token re-scored by both servers (the context up to it plus
   the token): the near-tie rule judges it with the noise bound of step 2.

Afterwards, without servers, ``moegate/e2e/scored_verdicts.py`` turns the scores and the
greedy and GSM8K comparisons into verdicts: identical, explained (near tie) or unexplained
for every divergence, an exact McNemar test per GSM8K filter. ``--strict`` keeps the older
byte-identity verdicts instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moegate.core import progress
from moegate.e2e import greedy, scoring, stats
from moegate.e2e.greedy import Completion
from moegate.e2e.prompts import Prompt
from moegate.e2e.scoring import Composition, Scored, TokenSeq

SCORE_CAP_FACTOR = 4
"""The scored comparison may grow to this many times ``--prompts`` (at most the committed set)."""
GSM8K_CAP_FACTOR = 4
"""GSM8K may grow to this many times ``--gsm8k-limit`` (at most all 1,319 questions)."""
PR_SEQUENCE = "+pr"
"""Suffix of a prompt's sequence id when it carries the PR's continuation (where it differs from the base's)."""
ROUNDS = 3
"""At most this many extensions: each one re-estimates the noise and the size it needs."""


@dataclass
class ScoreData:
    """Everything the scoring phase measured, kept for the verdicts and written as ``scores.json``."""

    labels: tuple[str, str]
    sequences: list[TokenSeq] = field(default_factory=list)
    scores: dict[str, list[dict[str, Scored]]] = field(default_factory=dict)
    """build label -> one map (sequence id -> scored) per composition."""
    compositions: list[Composition] = field(default_factory=list)
    prompts_used: int = 0
    cap: int = 0
    rounds: list[dict[str, Any]] = field(default_factory=list)
    gsm8k_divergences: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def seq_scores(self) -> list[stats.SeqScores]:
        a, b = self.labels
        out = []
        for s in self.sequences:
            (a1, a2), (b1, b2) = ([self.scores[lab][k][s.seq_id].logprobs for k in (0, 1)] for lab in (a, b))
            x1, x2, y1, y2 = (np.asarray(v, dtype=float) for v in (a1, a2, b1, b2))
            out.append(stats.SeqScores(s.seq_id, x1, x2, y1, y2, {"start": s.start}))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "labels": list(self.labels),
            "compositions": [c.__dict__ for c in self.compositions],
            "sequences": [{"seq_id": s.seq_id, "token_ids": list(s.token_ids), "start": s.start} for s in self.sequences],
            "scores": {lab: [{k: v.to_json() for k, v in m.items()} for m in per] for lab, per in self.scores.items()},
            "prompts_used": self.prompts_used, "cap": self.cap, "rounds": self.rounds,
            "gsm8k_divergences": self.gsm8k_divergences, "seconds": self.seconds,
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ScoreData:
        out = cls((str(d["labels"][0]), str(d["labels"][1])))
        out.compositions = [Composition(**c) for c in d["compositions"]]
        out.sequences = [TokenSeq(s["seq_id"], tuple(s["token_ids"]), int(s["start"])) for s in d["sequences"]]
        out.scores = {
            lab: [{k: Scored.from_json(v) for k, v in m.items()} for m in per] for lab, per in d["scores"].items()
        }
        out.prompts_used, out.cap, out.rounds = d["prompts_used"], d["cap"], d["rounds"]
        out.gsm8k_divergences, out.seconds = d.get("gsm8k_divergences", []), d.get("seconds", 0.0)
        return out


def compositions(in_flight: Sequence[int]) -> list[Composition]:
    waves = max(max(in_flight, default=4), 2)
    return [Composition(f"waves of {waves}, in order", waves), Composition("one at a time, reversed", 1, reverse=True)]


class _Side:
    """One build's running server, as the scoring phase needs it."""

    def __init__(self, label: str, srv: Any) -> None:
        self.label, self.srv = label, srv

    def score(self, seqs: Sequence[TokenSeq], comp: Composition, timeout_s: float) -> dict[str, Scored]:
        return scoring.score(
            self.srv.url, self.srv.model_name, seqs, comp, label=self.label, timeout_s=timeout_s,
            check_alive=lambda: self.srv.check_alive(grace_s=5), log_tail=self.srv.log_tail,
        )  # fmt: skip

    def tokenize(self, text: str, special: bool) -> list[int]:
        try:
            return scoring.tokenize(
                self.srv.url, self.srv.model_name, text, add_special_tokens=special, label=self.label
            )
        except scoring.ScoringError:
            self.srv.check_alive(grace_s=5)
            raise

    def generate(self, prompts: Sequence[Prompt], max_tokens: int) -> list[Completion]:
        return greedy.run_pass(
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
    timeout_s: float = scoring.SCORE_TIMEOUT_S,
) -> ScoreData:
    """Steps 1-3 of the module docstring, against two running servers (base first)."""
    t0 = time.monotonic()
    sides = [_Side(lab, s) for lab, s in zip(labels, servers, strict=True)]
    data = ScoreData(labels, compositions=compositions(in_flight))
    data.cap = min(available, cap if cap is not None else SCORE_CAP_FACTOR * len(prompts))
    data.scores = {lab: [{} for _ in data.compositions] for lab in labels}
    batch_prompts, batch_a, batch_b = list(prompts), list(greedy_1[0]), list(greedy_1[1])
    used = len(prompts)
    for rnd in range(ROUNDS + 1):
        new = _sequences(sides[0], batch_prompts, batch_a, batch_b)
        with progress.stage(f"scored: {len(new)} sequences", 2 * len(data.compositions), prefix="e2e") as bar:
            for side in sides:
                for k, comp in enumerate(data.compositions):
                    data.scores[side.label][k].update(side.score(new, comp, timeout_s))
                    bar.advance()
        data.sequences += new
        verdict = stats.decide(data.seq_scores(), detect=detect)
        data.rounds.append({"prompts": used, "sequences": len(data.sequences), "needed_prompts": verdict.needed})
        if verdict.needed <= used or used >= data.cap or rnd == ROUNDS:
            break
        more = min(verdict.needed, data.cap)
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
    timeout_s: float = scoring.SCORE_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """Step 4: every GSM8K question whose responses differ, its first divergent token scored by both servers."""
    from moegate.e2e import gsm8k

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
            prompts_text = {d: s["prompt"] for d, s in gsm8k.parse_samples(fh).items()}
    out = []
    for doc, ids in recorded.items():
        if ids is not None:  # the divergence as it happened
            context, (ctx, ra, rb) = "decoded", ids
        elif doc not in prompts_text:
            out.append(
                {"doc_id": doc, "explained": False, "reason": "the prompt text is not in the base run's samples"}
            )
            continue
        else:  # no record (an older run's folder): the texts re-tokenized, which can merge decoded tokens
            context = "re-tokenized"
            ctx = sides[0].tokenize(prompts_text[doc], True)
            ra = sides[0].tokenize(a[doc]["response"], False)
            rb = sides[0].tokenize(b[doc]["response"], False)
        pos = greedy.first_divergence(ra, rb)
        if pos is None:  # equal token for token: the texts differ only in a way the tokenizer folds
            out.append({"doc_id": doc, "explained": True, "position": None, "context": context,
                        "reason": f"token-identical ({context})"})  # fmt: skip
            continue
        prefix = ctx + ra[:pos]
        probe = ra[pos] if pos < len(ra) else rb[pos]
        seq = TokenSeq(f"gsm8k-{doc}", tuple(prefix + [probe]), len(prefix))
        tops = []
        for side in sides:
            scored = side.score([seq], Composition("one", 1), timeout_s)[seq.seq_id]
            tops.append(scored.top[0])
        a_tok = ra[pos] if pos < len(ra) else tops[0][0][0]
        b_tok = rb[pos] if pos < len(rb) else tops[1][0][0]
        out.append({
            "doc_id": doc, "position": pos, "context_tokens": len(ctx), "context": context,
            "tokens": {labels[0]: a_tok, labels[1]: b_tok},
            "ended": [lab for lab, r in zip(labels, (ra, rb), strict=True) if pos >= len(r)],
            "top": {labels[0]: tops[0], labels[1]: tops[1]},
        })  # fmt: skip
    return out


def write(data: ScoreData, out: Path) -> Path:
    path = out / "scores.json"
    path.write_text(json.dumps(data.to_json()) + "\n")
    return path


def read(out: Path) -> ScoreData | None:
    path = out / "scores.json"
    return ScoreData.from_json(json.loads(path.read_text())) if path.is_file() else None
