"""The greedy gate's comparison and parsing, on synthetic completions (the real servers are in tests/e2e)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moegate.e2e import greedy_passes
from moegate.e2e.greedy_passes import Completion, first_divergence, parse_choice
from moegate.e2e.rules.greedy import compare


@given(st.lists(st.integers(0, 9), max_size=20), st.lists(st.integers(0, 9), max_size=20))
def test_first_divergence_is_the_first_position_that_differs(a, b):
    pos = first_divergence(a, b)
    if pos is None:
        assert a == b
    else:
        assert a[:pos] == b[:pos] and (pos == min(len(a), len(b)) or a[pos] != b[pos])


def _c(pid: str, ids: list[int], top: list[list[tuple[int, float]]] | None = None) -> Completion:
    return Completion(pid, "h-" + pid, ids, top or [])


def test_identical_passes_pass():
    a = [_c("p1", [1, 2, 3]), _c("p2", [4, 5, 6])]
    res = compare("base", a, "pr", [_c("p2", [4, 5, 6]), _c("p1", [1, 2, 3])], gate="g")
    assert res.passed and "2 of 2" in res.summary


def test_a_divergence_names_prompt_position_both_continuations_and_the_top_two():
    top_a = [[(1, -0.1), (9, -2.0)], [(2, -0.50), (7, -0.51)], [(3, -0.2), (4, -3.0)]]
    top_b = [[(1, -0.1), (9, -2.0)], [(7, -0.50), (2, -0.51)], [(8, -0.2), (4, -3.0)]]
    a = [_c("p1", [1, 2, 3], top_a), _c("p2", [4, 5, 6])]
    b = [_c("p1", [1, 7, 8], top_b), _c("p2", [4, 5, 6])]
    res = compare("base", a, "pr", b, gate="g", decode=lambda ids: "".join(map(str, ids)))
    assert not res.passed and "1 of 2" in res.summary
    (d,) = res.differences
    assert d["prompt_id"] == "p1" and d["position"] == 1
    assert d["base"] == [2, 3] and d["pr"] == [7, 8] and d["base_text"] == "23"
    assert d["base_top"] == [(2, -0.50), (7, -0.51)]
    assert "near tie" in res.details_markdown and "margin 0.0100" in res.details_markdown


def test_a_different_prompt_set_is_not_a_pass():
    res = compare("base", [_c("p1", [1])], "pr", [_c("p9", [1])], gate="g")
    assert not res.passed and "different prompt sets" in res.summary


def test_parse_choice_reads_ids_and_sorted_top_candidates():
    choice = {
        "logprobs": {
            "tokens": ["token_id:5", "token_id:7"],
            "top_logprobs": [{"token_id:3": -1.5, "token_id:5": -0.5}, {"token_id:7": -0.1, "token_id:2": -4.0}],
        }
    }
    ids, top = parse_choice(choice)
    assert ids == [5, 7] and top[0] == [(5, -0.5), (3, -1.5)]


def test_parse_choice_refuses_text_tokens():
    with pytest.raises(ValueError, match="return_tokens_as_token_ids"):
        parse_choice({"logprobs": {"tokens": ["hello"], "top_logprobs": [{}]}})


def test_run_pass_refuses_zero_in_flight():
    with pytest.raises(ValueError, match="in_flight"):
        greedy_passes.run_pass("http://127.0.0.1:1", "m", [], 0)
