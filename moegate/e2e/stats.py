"""The e2e tier's statistics: the scored comparison, the near-tie rule, and their sizes (GSM8K's paired test: ``paired``).

Pure functions of numbers (no servers, no files): what ``moegate/e2e/scoring_phase.py`` decides
with. Every constant is derived in ``docs/design/e2e-rules.md`` from the facts measured on the
H200 in 2026-12; the short form is in each docstring.

The scored comparison sees each sequence four times: builds A (base) and B (PR), each
under two batch compositions 1 and 2 (waves of several sequences in file order; one at
a time in reverse order). Under the null (B computes what A computes) relabelling A2
as B2 leaves the joint distribution unchanged, so every statistic below that swaps
sign (or changes places with its noise twin) under that relabelling has a symmetric
null distribution, whatever the noise's size or shape: the signed-rank tests are exact
there, not approximations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ALPHA_SHIFT = 0.005
"""Level of the systematic-shift test (two-sided)."""
ALPHA_SPREAD = 0.005
"""Level of the spread test (one-sided: between builds wider than within a build)."""
POWER = 0.9
"""The power the size rule asks for at the promised effect."""
DETECT_NATS_PER_TOKEN = 0.001
"""The systematic shift the scored comparison promises to detect: 0.001 nats per scored token.

The H200 measurement: an MoE output 0.5 % too large moved the mean log-likelihood by
-0.13 nats over 4,377 tokens in 48 sequences, -0.0014 nats a token. The promise is a
little below that, so a bug of that size is found with room to spare."""
WILCOXON_MIN_ARE = 0.864
"""Hodges and Lehmann's lower bound of the signed-rank test's efficiency against the t test, over
every continuous symmetric distribution: the size rule divides the t test's size by it."""
TOKEN_FLOOR = 1.0
"""Per-token bound floor, nats: no single token's log-probability may move by more than a factor e
between builds unless a build moves that much against itself."""
TOKEN_FACTOR = 4.0
"""Per-token bound over the run's own largest same-build change (measured maxima 0.41-0.64, a ratio of
1.6 between pairings; 4 leaves 2.5 times that)."""
TIE_FACTOR = 2.0
"""A flip is a near tie when both margins are within twice the largest same-build change of one token's
log-probability: the margin is a difference of two such log-probabilities."""
TIE_FLOOR = 0.0
"""No tie margin without measured noise: on a build that reproduces itself bit for bit a flip is real."""
TOP_K = 5
"""vLLM's own logprob comparison in its model tests asks for the top 5."""
RESAMPLES = 9999
"""Signed-rank null by sign flips: exact while 2^n <= RESAMPLES (n <= 13), else Monte Carlo."""
SEED = 0


def normal_quantile(p: float) -> float:
    """The standard normal's ``p`` quantile (``z``)."""
    from scipy.stats import norm

    return float(norm.ppf(p))


def signed_rank_p(x: Sequence[float] | np.ndarray, alternative: str = "two-sided", seed: int = SEED) -> float:
    """Wilcoxon's signed-rank test of "symmetric about 0", zeros dropped; 1.0 when nothing is left.

    Without ties among the |values| scipy's exact null distribution; with ties (bf16 log-probabilities
    repeat) the null by sign flips (scipy's ``PermutationMethod``), exact for up to 13 non-zero values
    and a fixed-seed Monte Carlo of ``RESAMPLES`` beyond.
    """
    from scipy import stats

    arr = np.asarray(x, dtype=float)
    arr = arr[arr != 0]
    if arr.size == 0:
        return 1.0
    if np.unique(np.abs(arr)).size == arr.size and arr.size <= 200:
        method: Any = "exact"  # no ties: the closed-form null, exact and fast
    else:
        method = stats.PermutationMethod(n_resamples=RESAMPLES, rng=np.random.default_rng(seed))
    return float(stats.wilcoxon(arr, alternative=alternative, method=method).pvalue)


def exact_min_n(alpha: float, sides: int = 2) -> int:
    """The fewest non-zero values with which a signed-rank (or sign) test can reach ``alpha`` at all.

    All n of one sign is the most extreme outcome, with probability ``sides * 2**-n``.
    """
    return math.ceil(math.log2(sides / alpha))


# --- the scored comparison ----------------------------------------------------------------


@dataclass
class SeqScores:
    """One scored sequence: the log-probability of each of its scored tokens, four times."""

    seq_id: str
    a1: np.ndarray
    a2: np.ndarray
    b1: np.ndarray
    b2: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.a1, self.a2, self.b1, self.b2 = (np.asarray(v, dtype=float) for v in (self.a1, self.a2, self.b1, self.b2))
        n = {v.size for v in (self.a1, self.a2, self.b1, self.b2)}
        if len(n) != 1:
            raise ValueError(f"sequence {self.seq_id}: the four scorings have {sorted(n)} tokens")

    @property
    def tokens(self) -> int:
        return int(self.a1.size)

    def shift(self) -> float:
        """Between builds, matched composition, nats per sequence: mean of sum(B1-A1) and sum(B2-A2)."""
        return float(((self.b1 - self.a1).sum() + (self.b2 - self.a2).sum()) / 2)

    def self_shifts(self) -> tuple[float, float]:
        """Each build against itself across compositions (A2-A1, B2-B1), nats per sequence."""
        return float((self.a2 - self.a1).sum()), float((self.b2 - self.b1).sum())

    def spread_between(self) -> float:
        """Mean |change| per token between builds across compositions: (|B2-A1| + |B1-A2|)/2."""
        if not self.tokens:
            return 0.0
        return float((np.abs(self.b2 - self.a1).mean() + np.abs(self.b1 - self.a2).mean()) / 2)

    def spread_within(self) -> float:
        """Its null twin: each build against itself across compositions, (|A2-A1| + |B2-B1|)/2."""
        if not self.tokens:
            return 0.0
        return float((np.abs(self.a2 - self.a1).mean() + np.abs(self.b2 - self.b1).mean()) / 2)

    def max_between(self) -> tuple[float, int]:
        """Largest per-token change between builds at matched composition, and its token index."""
        if not self.tokens:
            return 0.0, -1
        d = np.maximum(np.abs(self.b1 - self.a1), np.abs(self.b2 - self.a2))
        i = int(np.argmax(d))
        return float(d[i]), i

    def max_within(self) -> float:
        if not self.tokens:
            return 0.0
        return float(max(np.abs(self.a2 - self.a1).max(), np.abs(self.b2 - self.b1).max()))


def noise_max(seqs: Sequence[SeqScores]) -> float:
    """The largest same-build change of one token's log-probability in the run (M_w)."""
    return max((s.max_within() for s in seqs), default=0.0)


def token_bound(m_within: float) -> float:
    return max(TOKEN_FLOOR, TOKEN_FACTOR * m_within)


def tie_bound(m_within: float) -> float:
    return max(TIE_FLOOR, TIE_FACTOR * m_within)


def needed_sequences(
    self_shifts: Sequence[float] | np.ndarray,
    tokens_per_sequence: float,
    *,
    detect: float = DETECT_NATS_PER_TOKEN,
    alpha: float = ALPHA_SHIFT,
    power: float = POWER,
) -> int:
    """How many sequences the shift test needs to find a shift of ``detect`` nats a token with ``power``.

    ``n = ((z(1-alpha/2) + z(power)) * sigma / (detect * T))**2 / 0.864``, sigma the standard deviation
    of the same-build per-sequence shifts and T the mean scored tokens per sequence, and never fewer
    than ``exact_min_n(alpha)``: with no noise at all the test still needs that many sequences of one
    sign to reach its level.
    """
    floor = exact_min_n(alpha)
    vals = np.asarray(self_shifts, dtype=float)
    if vals.size < 2 or tokens_per_sequence <= 0:
        return floor
    sigma = float(np.sqrt(np.mean(vals**2)))  # about 0: the null's mean is 0 by symmetry
    if sigma == 0.0:
        return floor
    n = (
        (normal_quantile(1 - alpha / 2) + normal_quantile(power)) * sigma / (detect * tokens_per_sequence)
    ) ** 2 / WILCOXON_MIN_ARE
    return max(floor, math.ceil(n))


@dataclass
class ScoredVerdict:
    passed: bool
    sequences: int
    tokens: int
    shift_mean: float
    """nats per sequence, B minus A (negative: B finds the sequences less likely)."""
    shift_per_token: float
    p_shift: float
    self_shift_range: tuple[float, float]
    spread_between: float
    spread_within: float
    p_spread: float
    max_between: float
    max_between_at: tuple[str, int]
    noise_max: float
    token_bound: float
    needed: int
    reasons: list[str]

    def summary(self) -> str:
        parts = [
            f"{self.sequences} sequences, {self.tokens} scored tokens",
            (
                f"shift {self.shift_mean:+.4f} nats/seq ({self.shift_per_token:+.5f}/token), signed-rank p={self.p_shift:.3g}"
                f" (level {ALPHA_SHIFT}); same build against itself {self.self_shift_range[0]:+.4f}..{self.self_shift_range[1]:+.4f}"
            ),
            (
                f"spread {self.spread_between:.5f} between vs {self.spread_within:.5f} within nats/token, p={self.p_spread:.3g}"
                f" (level {ALPHA_SPREAD})"
            ),
            f"largest token change {self.max_between:.4f} nats (bound {self.token_bound:.3f})",
        ]
        return "; ".join(parts)


def decide(
    seqs: Sequence[SeqScores], *, detect: float = DETECT_NATS_PER_TOKEN, m_within: float | None = None
) -> ScoredVerdict:
    """The scored comparison's rule: FAIL when any of the three clauses holds.

    1. systematic shift: the per-sequence shifts are not symmetric about 0 (two-sided signed rank,
       ``ALPHA_SHIFT``);
    2. spread: between-build changes per token are larger than the same-build changes across
       compositions, sequence by sequence (one-sided signed rank on the differences, ``ALPHA_SPREAD``);
    3. one token: some token moves between builds by more than ``token_bound`` of the run's own noise
       (``m_within``, the largest same-build change on sequences both builds share; by default over ``seqs``).
    """
    if not seqs:
        raise ValueError("the scored comparison got no sequences")
    shifts = np.array([s.shift() for s in seqs])
    selfs = [v for s in seqs for v in s.self_shifts()]
    tokens = sum(s.tokens for s in seqs)
    between = np.array([s.spread_between() for s in seqs])
    within = np.array([s.spread_within() for s in seqs])
    p_shift = signed_rank_p(shifts)
    p_spread = signed_rank_p(between - within, alternative="greater")
    m_w = noise_max(seqs) if m_within is None else m_within
    bound = token_bound(m_w)
    worst = max(((s.max_between(), s.seq_id) for s in seqs), key=lambda t: t[0][0])
    (mx, at), sid = worst
    self_means = [float(np.mean([s.self_shifts()[k] for s in seqs])) for k in (0, 1)]
    reasons = []
    if p_shift < ALPHA_SHIFT:
        reasons.append(
            f"systematic shift: mean {shifts.mean():+.4f} nats/seq, {int((shifts < 0).sum())} of {len(seqs)} "
            f"sequences lower and {int((shifts > 0).sum())} higher, p={p_shift:.3g} < {ALPHA_SHIFT}"
        )
    if p_spread < ALPHA_SPREAD:
        reasons.append(
            f"spread: {between.mean():.5f} nats/token between builds against {within.mean():.5f} within, "
            f"wider in {int((between > within).sum())} of {len(seqs)} sequences, p={p_spread:.3g} < {ALPHA_SPREAD}"
        )
    if mx > bound:
        reasons.append(f"one token: sequence {sid} token {at} moved {mx:.4f} nats > bound {bound:.3f}")
    n_mean = tokens / len(seqs)
    return ScoredVerdict(
        passed=not reasons,
        sequences=len(seqs),
        tokens=tokens,
        shift_mean=float(shifts.mean()),
        shift_per_token=float(shifts.sum() / tokens) if tokens else 0.0,
        p_shift=p_shift,
        self_shift_range=(min(self_means), max(self_means)),
        spread_between=float(between.mean()),
        spread_within=float(within.mean()),
        p_spread=p_spread,
        max_between=mx,
        max_between_at=(sid, at),
        noise_max=m_w,
        token_bound=bound,
        needed=needed_sequences(selfs, n_mean, detect=detect),
        reasons=reasons,
    )


# --- the near-tie rule at a first divergence -----------------------------------------------


@dataclass
class Divergence:
    """Two builds' choices at the first position where their tokens differ, with each one's top candidates."""

    a_token: int
    b_token: int
    a_top: list[tuple[int, float]]
    b_top: list[tuple[int, float]]

    def _margins(self, k: int) -> tuple[float, float] | None:
        """Each build's margin for its own token over the other's, in its own top ``k`` (its first where its own is
        missing); None unless each build's token is in the other's list."""
        a_top, b_top = dict(self.a_top[:k]), dict(self.b_top[:k])
        if self.b_token not in a_top or self.a_token not in b_top:
            return None
        return (
            a_top.get(self.a_token, max(a_top.values())) - a_top[self.b_token],
            b_top.get(self.b_token, max(b_top.values())) - b_top[self.a_token],
        )

    def explain(self, tie: float, k: int = TOP_K) -> tuple[bool, str]:
        """Explained (a near tie) when each build's token is in the other's top ``k`` and both margins are <= ``tie``.

        The first half is vLLM's own rule for comparing two runs' greedy logprobs; the second asks that the
        flip be within what the run's measured noise can move a margin.
        """
        margins = self._margins(k)
        if margins is None:
            if self.b_token not in dict(self.a_top[:k]):
                return False, f"{self.b_token} is not in build A's top {k} ({_fmt(self.a_top[:k])})"
            return False, f"{self.a_token} is not in build B's top {k} ({_fmt(self.b_top[:k])})"
        margin_a, margin_b = margins
        worst = max(abs(margin_a), abs(margin_b))
        text = f"margins {margin_a:.4f} (A) and {margin_b:.4f} (B) nats, tie bound {tie:.4f}"
        if worst > tie:
            return False, text
        return True, text

    def against(self, tie: float, k: int = TOP_K) -> str | None:
        """Where both re-scorings rank the two tokens alike, the build that decoded the one both put lower.

        The re-scorings agree when each build's token is in the other's top ``k`` and the margins mirror each
        other within ``tie`` (A's margin for its own token is B's against it), or when the two top lists are the
        same tokens in the same order, each log-probability within ``tie`` of its twin, and only one build's token
        is in them (the other's below both lists). Then ``"a"`` or ``"b"``: the same context at the same
        composition gave the same numbers, and the build named decoded what both rank lower. None when the
        re-scorings disagree, which no decode noise explains, or when neither token is in the lists.
        """
        if (margins := self._margins(k)) is not None:
            margin_a, margin_b = margins
            if abs(margin_a + margin_b) > tie or margin_a == 0:
                return None
            return "b" if margin_a > 0 else "a"
        same_lists = [t for t, _ in self.a_top[:k]] == [t for t, _ in self.b_top[:k]] and all(
            abs(x - y) <= tie for (_, x), (_, y) in zip(self.a_top[:k], self.b_top[:k], strict=True)
        )
        rank = {t: i for i, (t, _) in enumerate(self.a_top[:k])}
        ra, rb = rank.get(self.a_token, k), rank.get(self.b_token, k)
        if not same_lists or ra == rb:
            return None
        return "b" if ra < rb else "a"


def sign_test_greater(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2): the exact one-sided sign test (1.0 when n is 0)."""
    return float(sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n) if n else 1.0


def _fmt(top: Sequence[tuple[int, float]]) -> str:
    return ", ".join(f"{t}: {lp:.4f}" for t, lp in top)
