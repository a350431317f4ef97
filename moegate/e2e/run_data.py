"""A run's data and its raw files: the one place that says what an e2e run measured and how it is kept.

- ``Options``: what the run was asked (model, flags, gates, sizes, the promise).
- ``BuildRun``: one build's measurements against its server (greedy passes, GSM8K runs, timings).
- ``ScoreData``: the scoring phase's sequences and every build's log-probabilities of them.

Raw files, written by ``moegate/e2e/pair.py`` while it runs and read back by ``python -m moegate.e2e
compare`` (so a run made elsewhere, a lent GPU machine or a CI job's artifact, is judged, reported and
blessed here without serving again): ``greedy-LABEL.json`` per build, ``gsm8k-LABEL[-nN][-repeat]/``
per GSM8K run (lm-eval's own output folder), ``scores.json`` for the scoring phase.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moegate.e2e import golden_records, greedy_passes, lmeval, stats
from moegate.e2e.greedy_passes import Completion
from moegate.e2e.lmeval.task import ALL_QUESTIONS
from moegate.e2e.teacher_forced import Composition, Scored, TokenSeq
from moegate.serve.build import Build

GATES = ("greedy", "gsm8k")
PROMISES = ("identical", "equivalent")
"""What a pull request promises (docs/design/e2e-rules.md): ``identical`` computes what the base computes at the same
batch composition; ``equivalent`` may re-round, but neither biases the model nor damages it beyond what a
re-rounding does."""
DEFAULT_PROMISE = "identical"
"""The safe default: a re-rounding PR judged by it fails with the equivalent verdict named beside it (one
re-run with ``--promise equivalent``), where the other default would let a bug of a re-rounding's size pass."""
SCORE_CAP_FACTOR = 4
"""The scored comparison may grow to this many times ``--prompts`` (at most the committed set)."""
GSM8K_CAP_FACTOR = 4
"""GSM8K may grow to this many times ``--gsm8k-limit`` (at most all 1,319 questions)."""
PR_SEQUENCE = "+pr"
"""Suffix of a prompt's sequence id when it carries the PR's continuation (where it differs from the base's)."""


@dataclass
class Options:
    model: str
    server_args: tuple[str, ...]
    gates: tuple[str, ...] = GATES
    in_flight: tuple[int, ...] = (1, 4)
    max_tokens: int = greedy_passes.MAX_TOKENS
    eval_python: str | None = None
    gsm8k_limit: int = 250
    gsm8k_task: str = "moegate_gsm8k"
    gsm8k_dir: str | None = None
    gsm8k_in_flight: int = 4
    gsm8k_repeat: bool = True
    """Run GSM8K twice on each server and compare builds only where each reproduces itself."""
    startup_timeout_s: float = 900
    bless: bool = False
    golden_dir: Path = golden_records.E2E_GOLDEN_DIR
    """Where the goldens are read (and, with ``bless``, written): the committed ``golden/e2e`` by default."""
    strict: bool = False
    """Byte identity (greedy tokens, GSM8K responses) instead of the batch-robust rules (moegate/e2e/rules/)."""
    score_detect: float = 0.001
    score_cap: int | None = None
    score_timeout_s: float = 300
    gsm8k_detect: float = 0.05
    gsm8k_cap: int | None = None
    promise: str = DEFAULT_PROMISE
    """The promise the verdict judges (``PROMISES``); the run's data judges both."""
    strict_goldens: bool = False
    """A golden missing for a build's key fails (moegate's own release pair); otherwise it is reported, with the
    command that blesses it, and the comparison alone decides."""
    bless_command: str = ""
    """The command that blesses this run's goldens (the report quotes it where a golden is missing)."""


def gsm8k_cap(opts: Options) -> int:
    """The most questions GSM8K's size rule may grow to: ``--gsm8k-cap``, else 4 x the limit, at most the test set."""
    return min(ALL_QUESTIONS, opts.gsm8k_cap or GSM8K_CAP_FACTOR * opts.gsm8k_limit)


@dataclass
class BuildRun:
    build: Build
    info: dict[str, Any] = field(default_factory=dict)
    start_s: float | None = None
    greedy: dict[int, list[Completion]] = field(default_factory=dict)
    repeat: dict[int, list[Completion]] = field(default_factory=dict)
    gsm8k: Any = None
    gsm8k_repeat: Any = None
    seconds: dict[str, float] = field(default_factory=dict)


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
    reference: str | None = None
    """The reference build's label: the base re-rounded (``moegate.builds.planted --bug reround=3``), which scored the
    base's sequences once (composition 1) as the yardstick of what a re-rounding does (``scores[reference]``)."""

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
            "gsm8k_divergences": self.gsm8k_divergences, "seconds": self.seconds, "reference": self.reference,
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
        out.reference = d.get("reference")
        return out

    def base_sequences(self) -> list[TokenSeq]:
        """The sequences of the base's continuations: the same for every PR, whatever it diverges on."""
        return [s for s in self.sequences if not s.seq_id.endswith(PR_SEQUENCE)]


@dataclass(frozen=True)
class DecodePair:
    """Two greedy passes' log-probabilities of the same tokens, along their common prefix (decode steps)."""

    prompt_id: str
    a: np.ndarray
    b: np.ndarray
    """Each pass's log-probability of the common tokens, as it decoded them."""


def decode_pairs(a: list[Completion], b: list[Completion]) -> list[DecodePair]:
    """Per prompt of two passes over the same prompts: each token both generated (up to the first divergence), with
    the log-probability each pass decoded it with. A pass at ``c`` in flight decodes in steps of at most ``c`` tokens:
    at 1 and 4 in flight every step of the tiny models lies in the naive region (``T * top_k * 4 <= E``)."""
    by_id = {c.prompt_id: c for c in b}
    out = []
    for ca in a:
        cb = by_id.get(ca.prompt_id)
        if cb is None:
            continue
        xs, ys = [], []
        for tok_a, tok_b, top_a, top_b in zip(ca.token_ids, cb.token_ids, ca.top, cb.top, strict=False):
            if tok_a != tok_b:
                break
            la, lb = dict(top_a).get(tok_a), dict(top_b).get(tok_b)
            if la is None or lb is None:
                break
            xs.append(la)
            ys.append(lb)
        out.append(DecodePair(ca.prompt_id, np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)))
    return out


# --- raw files ----------------------------------------------------------------------------


def write_raw(run: BuildRun, out: Path) -> None:
    raw = {
        "build": run.build.label, "info": run.info, "start_s": run.start_s, "seconds": run.seconds,
        "server_args": list(run.build.server_args),
        "greedy": {str(c): [x.to_json() for x in v] for c, v in run.greedy.items()},
        "repeat": {str(c): [x.to_json() for x in v] for c, v in run.repeat.items()},
    }  # fmt: skip
    (out / f"greedy-{run.build.label}.json").write_text(json.dumps(raw) + "\n")


def read_raw(out: Path, label: str, *, gsm8k_runs: bool = True) -> BuildRun:
    """A build's run read back from its raw files (``greedy-LABEL.json``, ``gsm8k-LABEL/`` unless ``gsm8k_runs`` is
    false: an archive without lm-eval's samples cannot be read back, and the greedy and scored rules need none)."""
    raw = json.loads((out / f"greedy-{label}.json").read_text())
    build = Build(label, "(raw)", {}, tuple(raw.get("server_args", [])))
    run = BuildRun(build, info=raw["info"], start_s=raw.get("start_s"), seconds=raw.get("seconds", {}))
    run.greedy = {int(k): [Completion.from_record(c) for c in v] for k, v in raw.get("greedy", {}).items()}
    run.repeat = {int(k): [Completion.from_record(c) for c in v] for k, v in raw.get("repeat", {}).items()}
    if not gsm8k_runs:
        return run
    # a run GSM8K's size rule grew (moegate/e2e/pair.py) left gsm8k-LABEL-nN folders: the largest N is what it judged
    grown = sorted(
        (int(p.name.rsplit("-n", 1)[1]), p.name)
        for p in out.glob(f"gsm8k-{label}-n*")
        if p.name.rsplit("-n", 1)[1].isdigit()
    )
    stem = grown[-1][1] if grown else f"gsm8k-{label}"
    for attr, folder in (
        ("gsm8k", out / stem / "lm_eval"),
        ("gsm8k_repeat", out / f"{stem}-repeat" / "lm_eval"),
    ):
        if folder.is_dir():  # with the decoded ids where the run recorded them
            setattr(run, attr, lmeval.attach_decoded(lmeval.read_run(folder), folder.parent / lmeval.DECODED))
    return run


SCORES = "scores.json"


def write_scores(data: ScoreData, out: Path) -> Path:
    path = out / SCORES
    path.write_text(json.dumps(data.to_json()) + "\n")
    return path


def read_scores(out: Path) -> ScoreData | None:
    path = out / SCORES
    return ScoreData.from_json(json.loads(path.read_text())) if path.is_file() else None
