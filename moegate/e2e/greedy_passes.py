"""The greedy passes: the same prompts, temperature 0, each build's tokens and top log-probabilities.

A pass sends the prompts in waves of ``in_flight``: one completions request carrying
the wave's prompts, so the engine receives them together, and the next wave only
after the last one finished. With ``ignore_eos`` every sequence of a wave ends at the
same step, so a wave's batches are the same from run to run: what vLLM needs to
promise the same output (same version, hardware and batch composition). Token ids
come back as ids (``return_tokens_as_token_ids``) with the top five log-probabilities
at every position (``TOP_LOGPROBS``), so a divergence can be judged by the near-tie rule
of docs/design/e2e-rules.md (``moegate/e2e/rules/greedy.py``): each build's token in the other's top 5,
both margins within the run's measured noise; a *near tie* mark (under ``NEAR_TIE_NATS``) in
the divergence table is only a hint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moegate.e2e.prompts import Prompt
from moegate.serve.client import post

MAX_TOKENS = 128
TOP_LOGPROBS = 5
NEAR_TIE_NATS = 0.05
SHOWN_TOKENS = 12

Decode = Callable[[Sequence[int]], str]


@dataclass
class Completion:
    prompt_id: str
    prompt_sha256: str
    token_ids: list[int]
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    """Per position, the top candidates as (token id, logprob), best first."""

    def record(self, in_flight: int) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id,
            "prompt_sha256": self.prompt_sha256,
            "in_flight": in_flight,
            "token_ids": self.token_ids,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Completion:
        """From a golden record, or from a raw result (``to_json``), which also keeps the top candidates."""
        top = [[(int(t), float(lp)) for t, lp in pos] for pos in rec.get("top", [])]
        return cls(rec["prompt_id"], rec["prompt_sha256"], [int(t) for t in rec["token_ids"]], top)

    def to_json(self) -> dict[str, Any]:
        return {**self.record(0), "top": self.top}


def _token_id(token: str) -> int:
    if not token.startswith("token_id:"):
        raise ValueError(f"token {token!r} is not an id: the server ignored return_tokens_as_token_ids")
    return int(token.split(":", 1)[1])


def parse_choice(choice: dict[str, Any]) -> tuple[list[int], list[list[tuple[int, float]]]]:
    lp = choice.get("logprobs") or {}
    ids = [_token_id(t) for t in lp.get("tokens") or []]
    top = []
    for cand in lp.get("top_logprobs") or []:
        pairs = sorted(((_token_id(t), float(v)) for t, v in (cand or {}).items()), key=lambda p: -p[1])
        top.append(pairs)
    return ids, top


def run_pass(
    url: str,
    model_name: str,
    prompts: Sequence[Prompt],
    in_flight: int,
    *,
    max_tokens: int = MAX_TOKENS,
    seed: int = 0,
    check_alive: Callable[[], None] | None = None,
) -> list[Completion]:
    """One pass over the prompts, ``in_flight`` at a time, in the prompts' order."""
    if in_flight < 1:
        raise ValueError(f"in_flight={in_flight} < 1")
    out: list[Completion] = []
    for start in range(0, len(prompts), in_flight):
        wave = prompts[start : start + in_flight]
        body = {
            "model": model_name,
            "prompt": [p.text for p in wave],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "seed": seed,
            "ignore_eos": True,
            "logprobs": TOP_LOGPROBS,
            "return_tokens_as_token_ids": True,
        }
        try:
            resp = post(url.rstrip("/") + "/v1/completions", body)
        except Exception:
            if check_alive is not None:
                check_alive()  # a dead server is the better error: it carries the log
            raise
        choices = sorted(resp["choices"], key=lambda c: c["index"])
        if len(choices) != len(wave):
            raise RuntimeError(f"asked for {len(wave)} completions, got {len(choices)}")
        for p, c in zip(wave, choices, strict=True):
            ids, top = parse_choice(c)
            if len(ids) != max_tokens:
                raise RuntimeError(f"prompt {p.id}: {len(ids)} tokens back, {max_tokens} asked for with ignore_eos")
            out.append(Completion(p.id, p.sha256, ids, top))
    return out


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def tokenizer_decoder(model_dir: str) -> Decode | None:
    """Decode token ids with the model's own ``tokenizer.json`` when it and ``tokenizers`` are here."""
    path = Path(model_dir) / "tokenizer.json"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    if not path.is_file():
        return None
    tok = Tokenizer.from_file(str(path))
    return lambda ids: str(tok.decode(list(ids), skip_special_tokens=False))
