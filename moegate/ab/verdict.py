"""The A/B verdict of a run: per concurrency improved, regressed, equivalent within the margin, unresolved, or FAIL.

The rule (``moegate/ab/rule.py``, derived in ``docs/design/ab.md``) judges the decode time a token, one figure per
good start and level (``moegate/ab/latency.py``), at looks after whole rounds ``first .. cap`` of the plan:

- each look decides every level not yet settled (``rule.decide`` at the look's share of ``alpha``), from the
  starts of the rounds before it; a level whose build has fewer than 2 good starts with a figure there is
  not decided at that look;
- a level is settled by the first look that resolves it, the run stops when every level is settled (the
  driver adds no round after that), or at the cap, or when a build has no good start at all by a look;
- when the run is over, a level still unresolved stays **unresolved**, with the interval it reached and the
  change its spread resolves there; a level where a build has fewer than 2 good starts is **FAIL**, with
  the failed starts' errors and log tails: it is never dropped;
- a run not over yet (stopped by ``--max-new-starts``) is **pending** at its unsettled levels.

Output tok/s is reported beside it (ranges and the ratio of the builds' geometric means), the figure the
change description claims; it decides nothing (first-token stalls move it: ``moegate/ab/stalls.py``).

A run written before this rule (its plan has no ``min_starts``) is judged as a fixed design at the rounds it
has: one look, all of ``alpha`` at it.

**Gate** (``--gate``): fails on a level that is FAIL, on a *regressed* level whose decode time is at least
``gate_threshold`` slower (point estimate; default 3 %), and on a run not over. Improvements, equivalence
and unresolved levels pass (an unresolved level is stated in the summary with what it rules out). A false
gate failure needs a wrong *regressed*: at most ``alpha / 2`` (``rule.py``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from moegate.ab import rule
from moegate.ab.latency import start_decode
from moegate.ab.plan import Run

IMPROVED, REGRESSED, EQUIVALENT, UNRESOLVED = "improved", "regressed", "equivalent", "unresolved"
FAIL, PENDING = "FAIL", "pending"
_NAMES = {rule.IMPROVED: IMPROVED, rule.REGRESSED: REGRESSED, rule.EQUIVALENT: EQUIVALENT, rule.UNRESOLVED: UNRESOLVED}
DEFAULT_GATE_THRESHOLD = 0.03
TAIL_LINES = 20


@dataclass(frozen=True)
class Plan:
    """The rule's part of a run's plan."""

    first: int
    cap: int
    alpha: float
    margin: float
    legacy: bool = False  # a run written before the sequential rule: one look at the rounds it has

    @classmethod
    def of(cls, run: Run) -> Plan:
        plan = run.plan
        alpha = float(plan.get("alpha", rule.DEFAULT_ALPHA))
        margin = float(plan.get("margin", rule.DEFAULT_MARGIN))
        if "min_starts" in plan:
            return cls(int(plan["min_starts"]), int(plan["starts"]), alpha, margin)
        rounds = max(rule.MIN_STARTS, completed_rounds(run))
        return cls(rounds, rounds, alpha, margin, legacy=True)

    def shares(self, levels: int) -> list[float]:
        return rule.look_alphas(self.alpha, levels, self.first, self.cap)


@dataclass(frozen=True)
class LevelVerdict:
    concurrency: int
    verdict: str
    reason: str
    base_ms: tuple[float, ...]  # start figures: median decode ms a token, good starts in schedule order
    pr_ms: tuple[float, ...]
    base_tok_s: tuple[float, ...]
    pr_tok_s: tuple[float, ...]
    at: int | None = None  # starts a build (rounds) of the look that settled it, or of the last look
    used: tuple[int, int] = (0, 0)  # good starts (base, PR) that look used
    ratio: float | None = None  # decode time PR / base at that look (geometric means)
    ci: tuple[float, float] | None = None  # of that ratio, at ``confidence``
    confidence: float | None = None
    df: float | None = None
    spread: float | None = None  # pooled start-to-start sd of log decode time at that look
    resolves: float | None = None  # smallest change that look resolves with 80 % power at that spread
    failed_starts: tuple[dict, ...] = ()  # FAIL: {start, role, label, error, log_tail}

    @property
    def speedup(self) -> float | None:
        """The PR's decode speed-up, base / PR - 1 (positive: the PR decodes faster)."""
        return None if self.ratio is None else 1.0 / self.ratio - 1.0

    @property
    def speedup_ci(self) -> tuple[float, float] | None:
        return None if self.ci is None else (1.0 / self.ci[1] - 1.0, 1.0 / self.ci[0] - 1.0)

    @property
    def tok_s_change(self) -> float | None:
        if not self.base_tok_s or not self.pr_tok_s:
            return None
        return geomean(self.pr_tok_s) / geomean(self.base_tok_s) - 1.0


@dataclass(frozen=True)
class Look:
    starts: int  # a build (rounds)
    codes: dict[int, str]  # concurrency -> verdict at this look (UNRESOLVED when it could not decide)


@dataclass(frozen=True)
class Verdict:
    levels: tuple[LevelVerdict, ...]
    plan: Plan
    looks: tuple[Look, ...]
    state: str  # "settled" | "cap" | "no good start" | "in progress"
    gate_threshold: float = DEFAULT_GATE_THRESHOLD
    gate_failures: tuple[str, ...] = field(default=())

    @property
    def over(self) -> bool:
        return self.state != "in progress"

    @property
    def gate_passed(self) -> bool:
        return not self.gate_failures

    def level(self, concurrency: int) -> LevelVerdict:
        return next(lv for lv in self.levels if lv.concurrency == concurrency)

    def claims(self) -> list[LevelVerdict]:
        """Levels that state a difference (improved, regressed) or failed: what an A/A run must not have."""
        return [lv for lv in self.levels if lv.verdict in (IMPROVED, REGRESSED, FAIL)]

    def to_json(self) -> dict:
        out = asdict(self)
        out["gate_passed"] = self.gate_passed
        for lv, raw in zip(self.levels, out["levels"]):
            raw["speedup"], raw["speedup_ci"], raw["tok_s_change"] = lv.speedup, lv.speedup_ci, lv.tok_s_change
        return out


_LOG_MAX = math.log(sys.float_info.max)


def _exp(x: float) -> float:
    """``exp`` that ends at the largest float and at its reciprocal: with a degree of freedom or so and a small
    share of alpha an interval's bound on the log scale can pass ±709, where ``math.exp`` overflows, or gives
    0 that a speed-up divides by (the CPU smoke's first run met it); such a bound stays a number in
    verdict.json, and the report reads it as unbounded."""
    return math.exp(max(-_LOG_MAX, min(x, _LOG_MAX)))


def geomean(xs: Sequence[float]) -> float:
    """The geometric mean (of throughputs: the A/B's summary of a build's starts)."""
    return math.exp(math.fsum(math.log(x) for x in xs) / len(xs))


def completed_rounds(run: Run) -> int:
    """Rounds both of whose starts have run (good or failed), counted from round 0 without a gap."""
    done: dict[int, int] = {}
    for s in run.starts:
        done[s.round] = done.get(s.round, 0) + 1
    n = 0
    while done.get(n, 0) >= 2:
        n += 1
    return n


def rule_text(plan: Plan, levels: int, gate_threshold: float = DEFAULT_GATE_THRESHOLD) -> str:
    """The rule in one paragraph, for reports."""
    shares = plan.shares(levels)
    looks = (
        f"one look at {plan.first} starts a build (a run written before the sequential rule: judged as a fixed "
        "design at the rounds it has)"
        if plan.legacy
        else f"looks after rounds {plan.first}..{plan.cap} (whole rounds A B | B A)"
    )
    return (
        f"Judged on the decode time a token: per good start and level, the median over its requests of "
        f"(latency − first token) / (output tokens − 1), on a log scale; requests nested in their start, one "
        f"figure a start. Welch's interval for the ratio PR / base at each look, at family-wise {plan.alpha:g} "
        f"split over the {levels} levels and the looks ({looks}; per level and look "
        f"{', '.join(f'{a:.2g}' for a in shares)}). *equivalent*: the interval inside ±{plan.margin:.0%}; "
        f"*improved* / *regressed*: it excludes 1 and is not equivalent; a level is settled at the first look "
        f"that resolves it, the run adds rounds until every level is settled or the cap; *unresolved* at the "
        f"cap; **FAIL** where a build has fewer than {rule.MIN_STARTS} good starts. At most {plan.alpha:g} of "
        f"runs state any wrong verdict, {plan.alpha / 2:g} a wrong *regressed*. Gate: fails on FAIL, on "
        f"*regressed* with the PR's decode time ≥ {gate_threshold:.0%} slower, and on a run not over."
    )


def _failed_starts(run: Run, role: str) -> tuple[dict, ...]:
    out = []
    for s in run.starts:
        if s.role == role and s.status != "ok":
            tail = "\n".join((s.log_tail or "").rstrip().splitlines()[-TAIL_LINES:])
            out.append({"start": s.index + 1, "role": role, "label": s.label, "error": s.error, "log_tail": tail})
    return tuple(out)


@dataclass(frozen=True)
class _Decided:
    """One level at one look where both builds had starts enough to decide."""

    n: int  # starts a build (rounds)
    a: float  # the level's share of alpha there
    base: list[float]  # log start figures
    pr: list[float]
    d: float
    lo: float
    hi: float
    df: float
    code: str


def _looks(
    plan: Plan, levels: list[int], figures: dict[int, dict[str, list[tuple[int, float]]]], done: int
) -> tuple[list[Look], list[dict[int, _Decided]]]:
    """Every look the plan has taken by ``done`` complete rounds, and what each decided per level."""
    shares = plan.shares(len(levels))
    looks: list[Look] = []
    decided: list[dict[int, _Decided]] = []
    for k, n in enumerate(range(plan.first, min(plan.cap, done) + 1)):
        codes: dict[int, str] = {}
        here: dict[int, _Decided] = {}
        for c in levels:
            base = [y for r, y in figures[c]["base"] if r < n]
            pr = [y for r, y in figures[c]["pr"] if r < n]
            if min(len(base), len(pr)) < rule.MIN_STARTS:
                codes[c] = UNRESOLVED  # not decided at this look: too few good starts with a figure
                continue
            got = rule.decide(base, pr, shares[k], plan.margin)
            codes[c] = _NAMES[int(got["code"])]
            values = {key: float(np.asarray(got[key])) for key in ("d", "lo", "hi", "df")}
            here[c] = _Decided(n, shares[k], base, pr, **values, code=codes[c])
        looks.append(Look(n, codes))
        decided.append(here)
    return looks, decided


def _stats(x: _Decided | None) -> dict:
    """A decided look's figures as LevelVerdict fields."""
    if x is None:
        return {}
    sd = rule.pooled_sd([x.base, x.pr])
    return {
        "at": x.n,
        "used": (len(x.base), len(x.pr)),
        "ratio": math.exp(x.d),
        "ci": (_exp(x.lo), _exp(x.hi)),
        "confidence": 1.0 - x.a,
        "df": x.df,
        "spread": sd,
        "resolves": None if sd is None else rule.resolvable(sd, x.n, x.a),
    }


def judge(run: Run, folder: str | Path, gate_threshold: float = DEFAULT_GATE_THRESHOLD) -> Verdict:
    """The verdict of ``run`` (its folder holds the measured result dicts), as the module docstring says."""
    plan = Plan.of(run)
    levels = list(run.plan["concurrency"])
    rounds = {s.index: s.round for s in run.starts}
    done = completed_rounds(run)
    figures: dict[int, dict[str, list[tuple[int, float]]]] = {c: {"base": [], "pr": []} for c in levels}
    for (index, c), start in sorted(start_decode(run, folder).items()):
        if c in figures:
            figures[c][start.role].append((rounds[index], start.log_median))
    looks, decided = _looks(plan, levels, figures, done)

    settled: dict[int, int] = {}  # concurrency -> index of the look that settled it
    for k, look in enumerate(looks):
        for c in levels:
            if c not in settled and look.codes[c] != UNRESOLVED:
                settled[c] = k
    good = {role: sum(1 for s in run.starts if s.role == role and s.status == "ok") for role in ("base", "pr")}
    if looks and len(settled) == len(levels):
        state = "settled"
    elif looks and min(good.values()) == 0:
        state = "no good start"
    elif done >= plan.cap:
        state = "cap"
    else:
        state = "in progress"

    out = []
    for c in levels:
        base_ms = tuple(math.exp(y) for _, y in figures[c]["base"])
        pr_ms = tuple(math.exp(y) for _, y in figures[c]["pr"])
        tok = {
            role: tuple(s.measured[c] for s in run.starts if s.role == role and s.status == "ok" and c in s.measured)
            for role in ("base", "pr")
        }
        where = settled.get(c, len(looks) - 1)
        stats = _stats(decided[where].get(c) if looks else None)
        failed: tuple[dict, ...] = ()
        if c in settled:
            verdict = looks[settled[c]].codes[c]
            reason = _settled_reason(verdict, plan.margin, looks[settled[c]].starts)
        elif state == "in progress":
            verdict, reason = PENDING, f"the run is not over: next look after round {max(plan.first, done + 1)}"
        elif min(len(base_ms), len(pr_ms)) < rule.MIN_STARTS:
            short = [role for role, xs in (("base", base_ms), ("pr", pr_ms)) if len(xs) < rule.MIN_STARTS]
            failed = tuple(f for role in short for f in _failed_starts(run, role))
            what = "; ".join(f"start {f['start']} ({f['label']}): {f['error']}" for f in failed)
            verdict = FAIL
            reason = (
                f"too few good starts with a decode time: base {len(base_ms)}, PR {len(pr_ms)} "
                f"(need {rule.MIN_STARTS} a build)"
                + (f"; failed: {what}" if what else "; no decode time in the result files of the good ones")
            )
        else:
            verdict, reason = UNRESOLVED, _unresolved_reason(stats, plan.margin)
        out.append(
            LevelVerdict(c, verdict, reason, base_ms, pr_ms, tok["base"], tok["pr"], **stats, failed_starts=failed)
        )

    failures = []
    for lv in out:
        if lv.verdict == FAIL:
            failures.append(f"concurrency {lv.concurrency}: FAIL ({lv.reason})")
        elif lv.verdict == REGRESSED and lv.ratio is not None and lv.ratio >= 1.0 + gate_threshold:
            failures.append(
                f"concurrency {lv.concurrency}: regressed, decode time {lv.ratio - 1:+.1%} "
                f"(threshold +{gate_threshold:.0%})"
            )
    if state == "in progress":
        failures.append("the run is not over (resume it with --resume)")
    return Verdict(tuple(out), plan, tuple(looks), state, gate_threshold, tuple(failures))


def _settled_reason(verdict: str, margin: float, n: int) -> str:
    what = {
        EQUIVALENT: f"the interval lies within ±{margin:.0%}",
        IMPROVED: "the interval lies below a decode-time ratio of 1 and reaches past the margin",
        REGRESSED: "the interval lies above a decode-time ratio of 1 and reaches past the margin",
    }[verdict]
    return f"{what} (settled at {n} starts a build)"


def _unresolved_reason(stats: dict, margin: float) -> str:
    if not stats:
        return "no look could decide it"
    lo, hi = stats["ci"]
    bounds = [
        f"a {what} of more than {x:.1%}"
        for what, x in (("slow-down", max(hi - 1.0, 0.0)), ("speed-up", max(1.0 / lo - 1.0, 0.0)))
        if x <= 9  # past ten times the interval says only "unbounded"
    ]
    text = (
        f"at the cap ({stats['at']} starts a build) the interval holds no change and reaches past ±{margin:.0%}: "
        + (f"it rules out {' and '.join(bounds)}" if bounds else "it is unbounded, so it rules nothing out")
    )
    resolves = stats.get("resolves")
    if resolves is not None and math.isfinite(resolves) and resolves <= 9:
        text += f"; this spread resolves changes of ±{resolves:.1%} there (80 % power)"
    else:
        text += "; this spread resolves no change under ten times there"
    return text
