"""What an A/B run is, as data: the builds it reads, the dataset, the plan, the schedule, the start records and the run (``run.json``).

Nothing here starts a process: ``moegate.ab.driver`` runs a plan, ``moegate.ab.workers`` holds the
benchmark processes."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

DEFAULT_CONCURRENCY = (1, 2, 3, 4, 8, 16)


ROLES = ("base", "pr")


class DriverError(RuntimeError):
    """Bad input to the driver: one line, raised before any server starts."""


class BenchError(RuntimeError):
    """A benchmark run failed; the message ends with its log's last lines."""


class BuildLike(Protocol):
    """What the driver reads of a build (read-only: moegate.serve.build.Build is frozen)."""

    @property
    def label(self) -> str: ...
    @property
    def python(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def server_args(self) -> tuple[str, ...]: ...


class ServerLike(Protocol):
    url: str
    model_name: str

    def log_tail(self, n: int = 40) -> str: ...
    def check_alive(self) -> None: ...


ServerFactory = Callable[..., AbstractContextManager[ServerLike]]


BenchFn = Callable[[BuildLike, list[str], Path, Path], dict]


@dataclass(frozen=True)
class Dataset:
    """``sharegpt`` with a path to a valid ShareGPT JSON list, or ``random`` with stated lengths."""

    name: str
    path: str | None = None
    input_len: int | None = None

    def __post_init__(self) -> None:
        if self.name == "sharegpt" and not self.path:
            raise DriverError("the sharegpt dataset needs --dataset-path FILE (a ShareGPT JSON list)")
        if self.name == "random" and not self.input_len:
            raise DriverError("the random dataset needs --random-input-len N")
        if self.name not in ("sharegpt", "random"):
            raise DriverError(f"unknown dataset {self.name!r}: sharegpt or random")

    def bench_args(self, output_len: int) -> list[str]:
        if self.name == "sharegpt":
            return [
                "--dataset-name",
                "sharegpt",
                "--dataset-path",
                str(self.path),
                "--sharegpt-output-len",
                str(output_len),
            ]
        return [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(self.input_len),
            "--random-output-len",
            str(output_len),
        ]

    def describe(self, output_len: int) -> str:
        if self.name == "sharegpt":
            return f"ShareGPT records from {self.path}, {output_len} output tokens each (--ignore-eos)"
        return f"random token prompts of {self.input_len} tokens, {output_len} output tokens each (--ignore-eos)"


def sharegpt_records(path: str | Path) -> int:
    """Records vLLM's ShareGPT loader can use (a conversation of 2+ turns), or one-line DriverError."""
    p = Path(path)
    if not p.is_file():
        raise DriverError(f"--dataset-path {p}: no such file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DriverError(
            f"--dataset-path {p}: not valid JSON ({exc}); a truncated dump needs a streaming "
            "parse written back as a list (moegate/e2e/prompts.py)"
        ) from None
    if not isinstance(data, list):
        raise DriverError(f"--dataset-path {p}: expected a JSON list of ShareGPT records")
    return sum(1 for r in data if isinstance(r, dict) and len(r.get("conversations") or ()) >= 2)


@dataclass(frozen=True)
class Plan:
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    starts: int = 5  # per build: the cap, rounds a run may grow to
    output_len: int = 128
    target_seconds: float = 30.0
    min_rounds: int = 4
    warmup_rounds: int = 2
    seed: int = 1
    prompts: Mapping[int, int] | None = None  # fixed N_c instead of sizing by time
    extra_bench_args: tuple[str, ...] = ()
    min_starts: int | None = None  # per build: the first look (moegate/ab/rule.py); default min(3, starts), >= 2
    alpha: float = 0.05  # family-wise, over the levels and the looks
    margin: float = 0.05  # equivalent: no change of this much either way
    vary_prompts: bool = False  # draw other prompts each round (the runs before the decode-time rule did)

    def __post_init__(self) -> None:
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise DriverError(f"concurrency levels must be >= 1, got {self.concurrency}")
        if self.starts < 1:
            raise DriverError(f"starts={self.starts}: need at least 1 (2 for a verdict)")
        if self.min_starts is None:
            object.__setattr__(self, "min_starts", max(2, min(3, self.starts)))
        assert self.min_starts is not None
        if not 2 <= self.min_starts <= max(2, self.starts):
            raise DriverError(
                f"--min-starts {self.min_starts}: the first look needs 2 starts a build at least and at most --starts"
                f" ({self.starts})"
            )
        if self.output_len < 2:
            raise DriverError(f"--output-len {self.output_len}: a decode time a token needs 2 output tokens at least")
        if self.min_rounds < 1 or self.warmup_rounds < 1 or self.target_seconds <= 0:
            raise DriverError("min_rounds, warmup_rounds must be >= 1 and target_seconds > 0")
        if not 0 < self.alpha < 1 or not 0 < self.margin < 1:
            raise DriverError(f"--alpha {self.alpha} and --margin {self.margin} must lie in (0, 1)")

    def size(self, c: int, warm_tok_s: float | None) -> int:
        if self.prompts is not None and c in self.prompts:
            return max(c, self.prompts[c])
        rounds = self.min_rounds
        if warm_tok_s and warm_tok_s > 0:
            rounds = max(rounds, math.ceil(self.target_seconds * warm_tok_s / (self.output_len * c)))
        return c * rounds

    def seeds(self, round_: int, j: int) -> tuple[int, int]:
        """(warm-up seed, measured seed) for round ``round_``, level index ``j``: the same prompts every round
        unless ``vary_prompts``; within a server, another prompt set for every run."""
        base = self.seed + (1000 * round_ if self.vary_prompts else 0)
        return base + 500 + j, base + j


def schedule(starts: int) -> list[tuple[int, str]]:
    """(round, role) in start order: A B | B A | A B ..."""
    out: list[tuple[int, str]] = []
    for r in range(starts):
        out += [(r, "base"), (r, "pr")] if r % 2 == 0 else [(r, "pr"), (r, "base")]
    return out


@dataclass
class StartRecord:
    index: int
    round: int
    role: str
    label: str
    status: str = "pending"  # ok | failed
    error: str | None = None
    log_tail: str | None = None
    warmup: dict[int, float] = field(default_factory=dict)  # tok/s, not counted
    measured: dict[int, float] = field(default_factory=dict)  # tok/s
    durations: dict[int, float] = field(default_factory=dict)  # s, of each measured run
    seconds: float = 0.0
    folder: str = ""
    started: str = ""  # UTC, ISO 8601; empty in runs written before it was kept


@dataclass
class Run:
    """Everything the report needs, as written to and read back from ``run.json``."""

    builds: dict[str, dict]
    model: str
    server_args: list[str]
    plan: dict
    dataset: str
    prompts: dict[int, int]
    prompts_note: str
    starts: list[StartRecord]
    # moegate.core.hashing.model_hash of a model folder; empty for a hub name, or before it was kept
    model_hash: str = ""

    def samples(self, role: str) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {c: [] for c in self.plan["concurrency"]}
        for s in self.starts:
            if s.role == role and s.status == "ok":
                for c, v in s.measured.items():
                    out.setdefault(c, []).append(v)
        return out

    def measured_results(self, folder: str | Path) -> Iterator[tuple[StartRecord, int, dict]]:
        """``(start, concurrency, vLLM's result dict)`` for each good start's measured run at each level, read from
        ``measured-c<c>.json`` in the run's ``folder``; a file that is missing or not JSON is left out (its level
        then has one start fewer, which each reader counts)."""
        for s in self.starts:
            if s.status != "ok":
                continue
            for c in self.plan["concurrency"]:
                try:
                    raw = json.loads((Path(folder) / s.folder / f"measured-c{c}.json").read_text())
                except (OSError, ValueError):
                    continue
                if isinstance(raw, dict):
                    yield s, c, raw

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> Run:
        starts = []
        for s in raw["starts"]:
            s = dict(s)
            s["warmup"] = {int(k): v for k, v in s["warmup"].items()}
            s["measured"] = {int(k): v for k, v in s["measured"].items()}
            s["durations"] = {int(k): v for k, v in s.get("durations", {}).items()}
            starts.append(StartRecord(**s))
        fields = {k: raw[k] for k in ("builds", "model", "server_args", "plan", "dataset", "prompts_note")}
        return cls(
            **fields,
            prompts={int(k): v for k, v in raw["prompts"].items()},
            starts=starts,
            model_hash=raw.get("model_hash", ""),
        )


def safe_label(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in label)[:40]


def load_run(folder: str | Path) -> Run:
    path = Path(folder) / "run.json"
    if not path.is_file():
        raise DriverError(f"{folder}: no run.json (not an A/B run folder)")
    return Run.from_json(json.loads(path.read_text()))
