"""The e2e noise is the base's alone (issue 45 item 3): the decode and greedy rules take their noise from the base's
repeat, and a PR that disagrees with its own repeat more than the base does fails ``identical`` on a row of its own.

Synthetic runs (each build's greedy passes, token by token) and the committed H200 counts of prompts whose repeat
parted from its pass (results/e2e-promises-h200.md, "Two starts of one build compute differently").
"""

from __future__ import annotations

import numpy as np
import pytest

from moegate.e2e import run_data as e2e
from moegate.e2e.greedy_passes import Completion
from moegate.e2e.rules import identical, judge, noise, repeats
from moegate.e2e.teacher_forced import Composition, Scored, TokenSeq
from moegate.e2e.verdict import GateResult
from moegate.serve.build import Build

PROMPTS, TOKENS = 16, 24


def _completion(pid: str, lps: np.ndarray, part_at: int | None = None) -> Completion:
    """A greedy completion of tokens 0.. with these log-probabilities; from ``part_at`` on, other tokens."""
    ids = [t if part_at is None or t < part_at else t + 500 for t in range(lps.size)]
    return Completion(pid, "sha", ids, [[(t, float(v)), (t + 1000, float(v) - 3.0)] for t, v in zip(ids, lps)])


def _run(label: str, lps: dict[str, np.ndarray], *, repeat_noise: float = 0.0, parts: frozenset[str] = frozenset(),
         seed: int = 0) -> e2e.BuildRun:  # fmt: skip
    """A build with passes at 1 and 4 in flight and a repeat at 4: the repeat's log-probabilities moved by
    ``repeat_noise`` (random sign), and its tokens parted at position 1 on the prompts ``parts``."""
    rng = np.random.default_rng(seed)
    run = e2e.BuildRun(Build(label, "py"))
    for c in (1, 4):
        run.greedy[c] = [_completion(pid, x) for pid, x in lps.items()]
    run.repeat[4] = [
        _completion(pid, x + repeat_noise * rng.normal(size=x.size), 1 if pid in parts else None)
        for pid, x in lps.items()
    ]  # fmt: skip
    return run


def _base(seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"p{i}": rng.normal(-2.0, 1.0, TOKENS) for i in range(PROMPTS)}


def _data(lps: dict[str, np.ndarray], pr_moves: float = 0.0) -> e2e.ScoreData:
    """Scores of the base's continuations: the base bit-identical under both compositions, the PR's composition 2
    moved by ``pr_moves`` on every token."""
    data = e2e.ScoreData(("base", "pr"), compositions=[Composition("w", 4), Composition("r", 1, True)])
    data.scores = {"base": [{}, {}], "pr": [{}, {}]}
    for pid, x in lps.items():
        data.sequences.append(TokenSeq(pid, (*range(900, 905), *range(TOKENS)), 5))
        for k, lab in ((0, "base"), (1, "base"), (0, "pr")):
            data.scores[lab][k][pid] = Scored(pid, list(map(float, x)), [1] * x.size, [[(1, float(v))] for v in x])
        y = x + pr_moves
        data.scores["pr"][1][pid] = Scored(pid, list(map(float, y)), [1] * x.size, [[(1, float(v))] for v in y])
    data.prompts_used, data.cap = PROMPTS, PROMPTS
    return data


def _rows(base: e2e.BuildRun, pr: e2e.BuildRun, data: e2e.ScoreData, golden_dir) -> dict[str, GateResult]:
    """Every row ``judge`` gives under ``identical`` (the goldens looked up in an empty folder: missing, not judged)."""
    opts = e2e.Options(model="m", server_args=(), gates=("greedy",), promise="identical", golden_dir=golden_dir)
    return {r.gate: r for r in judge(base, pr, opts, None, data)}


def test_a_pr_whose_own_repeat_is_unstable_fails_identical_on_its_own_row_though_the_builds_agree(tmp_path):
    """Both builds decode the same tokens with the same log-probabilities at 1 and 4 in flight (the between-build
    rules pass), but the PR's repeat at 4 in flight parts from its pass on 10 of 16 prompts, the base's on none."""
    lps = _base()
    base, pr = _run("base", lps), _run("pr", lps, parts=frozenset(f"p{i}" for i in range(10)))
    rows = _rows(base, pr, _data(lps), tmp_path)
    row = rows["repeat (identical), 4 in flight"]
    assert not row.passed and row.summary.startswith("FAIL (identical):"), row.summary
    assert "10 pr only against 0 base only" in row.summary and "depends on the batch" in row.summary
    assert row.differences[0]["repeat"]["pr_parted"] == [f"p{i}" for i in range(10)]
    # between the builds nothing moved: the scored, decode and between-build greedy rows pass
    for gate in ("scored (identical), base vs pr", "decode (identical), 1 in flight", "decode (identical), 4 in flight",
                 "greedy (identical), 1 in flight", "greedy (identical), 4 in flight"):  # fmt: skip
        assert rows[gate].passed, (gate, rows[gate].summary)


def test_a_same_build_pair_passes_the_repeat_row(tmp_path):
    """Two servers of one build: each repeat parts on a few prompts of its own, the PR's on no more than chance, and
    moves its log-probabilities by the same noise: the repeat row and every between-build row pass."""
    lps = _base()
    base = _run("base", lps, repeat_noise=0.01, parts=frozenset({"p1", "p2", "p3"}), seed=2)
    pr = _run("pr", lps, repeat_noise=0.01, parts=frozenset({"p3", "p5", "p7", "p9"}), seed=3)
    rows = _rows(base, pr, _data(lps), tmp_path)
    row = rows["repeat (identical), 4 in flight"]
    assert row.passed and "3 pr only against 2 base only" in row.summary, row.summary
    between = [g for g in rows if "golden" not in g and "twice" not in g]
    assert len(between) == 6 and all(rows[g].passed for g in between), {g: rows[g].summary for g in between}


# the H200 panel's servers against their own repeats at 4 in flight (results/e2e-promises-h200.md, "Two starts of
# one build compute differently"): prompts of 64 whose repeat parted, (base, PR)
SAME_OR_HARMLESS = {
    "s-trained": (1, 3), "s-random": (3, 1), "s-random-fp8": (4, 2), "h-tuned": (2, 1), "h-res-uva": (0, 3),
    "h-032-033": (2, 2), "h-reround7": (2, 3), "h-batchinv": (2, 1), "h-eager": (0, 1), "b-scale-1": (3, 1),
}  # fmt: skip
BATCH_DEPENDENT_BUGS = {
    "b-decode-host-05": (2, 15), "b-decode-host-1": (0, 12), "b-decode-host-2": (2, 17), "b-random-decode-10": (1, 19),
}  # fmt: skip


def _parted_pair(n_base: int, n_pr: int, shared: int) -> tuple[e2e.BuildRun, e2e.BuildRun]:
    lps = {f"p{i}": np.full(4, -1.0) for i in range(64)}
    ids = list(lps)
    base_parts = frozenset(ids[:n_base])
    pr_parts = frozenset(ids[n_base - shared : n_base - shared + n_pr])
    return _run("base", lps, parts=base_parts), _run("pr", lps, parts=pr_parts)


@pytest.mark.parametrize("pair", sorted(SAME_OR_HARMLESS))
def test_the_h200s_same_build_and_dispatch_only_repeat_counts_pass_however_their_prompts_overlap(pair):
    n_base, n_pr = SAME_OR_HARMLESS[pair]
    for shared in range(min(n_base, n_pr) + 1):
        res = repeats.repeat_result(*_parted_pair(n_base, n_pr, shared), 4)
        assert res.passed, (pair, shared, res.summary)


@pytest.mark.parametrize("pair", sorted(BATCH_DEPENDENT_BUGS))
def test_the_h200s_batch_dependent_decode_bugs_fail_even_where_no_parted_prompt_is_shared(pair):
    n_base, n_pr = BATCH_DEPENDENT_BUGS[pair]
    res = repeats.repeat_result(*_parted_pair(n_base, n_pr, 0), 4)
    assert not res.passed, (pair, res.summary)


def test_same_build_pairs_trip_the_repeat_row_at_most_at_its_level():
    """2,000 simulated same-build pairs of 64 prompts, each server's repeat parting on a prompt with probability
    0.05 (2-4 of 64 as measured) or 0.25: the row fails at most ``ALPHA_REPEAT`` of them (the sign test is exact
    at its level under the null, conservative for a discrete count)."""
    rng = np.random.default_rng(0)
    for rate in (0.05, 0.25):
        fails = 0
        for _ in range(2000):
            b, p = np.flatnonzero(rng.random(64) < rate), np.flatnonzero(rng.random(64) < rate)
            fails += repeats.repeat_p({f"p{i}" for i in p}, {f"p{i}" for i in b}) < repeats.ALPHA_REPEAT
        assert fails / 2000 <= repeats.ALPHA_REPEAT, (rate, fails)


@pytest.mark.parametrize("c", [1, 4])
def test_noise_a_pr_adds_to_its_own_repeat_cannot_move_its_decode_verdict_from_fail_to_pass(c):
    """The PR decodes every token 0.01 nats lower (a decode-only bug): FAIL at 1 and 4 in flight. The same PR with
    its own repeat moved by 0.05 nats a token (an instability of its own) must still FAIL: the noise twin is the
    base's repeat, not an average in which the PR's instability would exceed its error."""
    lps = _base()
    base = _run("base", lps)
    bug = {k: v - 0.01 for k, v in lps.items()}
    before = identical.decode_result(base, _run("pr", bug), c)
    after = identical.decode_result(base, _run("pr", bug, repeat_noise=0.05), c)
    assert not before.passed, before.summary
    assert not after.passed, after.summary
    assert "within (base's repeat at 4 in flight)" in after.summary


def test_the_tie_bound_and_the_token_bound_take_the_bases_noise_alone(tmp_path):
    """The PR's own changes (between its compositions, between its pass and its repeat) widen neither the greedy
    tie bound nor the scored comparison's one-token bound; the base's do."""
    lps = _base()
    data, base = _data(lps), _run("base", lps)
    quiet = noise.tie_bound(data, (base,))
    noisy_pr = _run("pr", lps, repeat_noise=0.3)
    assert noise.within_max(_data(lps, pr_moves=0.4)) == noise.within_max(data) == 0.0
    assert noise.tie_bound(_data(lps, pr_moves=0.4), (base,)) == quiet == 0.0
    rows = _rows(base, noisy_pr, _data(lps, pr_moves=0.4), tmp_path)
    assert "tie bound 0.0000 nats" in rows["greedy (identical), 4 in flight"].summary
    # the base's own noise does count
    assert noise.tie_bound(data, (_run("base", lps, repeat_noise=0.1, seed=4),)) > 0.1
