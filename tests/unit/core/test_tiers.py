"""One vocabulary of tiers and models (moegate/core/tiers.py): every door refuses an unknown one alike, in one line."""

from __future__ import annotations

import pytest

from moegate.core import tiers


def test_tiers_come_back_in_the_order_given_each_once():
    assert tiers.parse_tiers(" kernels, dispatch ,kernels", tiers.CI_TIERS) == ["kernels", "dispatch"]


@pytest.mark.parametrize(
    ("text", "known", "line"),
    [
        (
            "dispatch,kernals",
            tiers.GATE_TIERS,
            "unknown tier 'kernals' in tiers='dispatch,kernals'; known: dispatch, kernels, sweep, diff",
        ),
        (" , ", tiers.CI_TIERS, "tiers=' , ' names no tier; choose from dispatch, meta, kernels, e2e, ab"),
        ("e2e", tiers.BUILDKITE_TIERS, "unknown tier 'e2e' in tiers='e2e'; known: dispatch, kernels"),
    ],
)
def test_an_unknown_tier_or_none_is_one_line_naming_what_is_known(text, known, line):
    with pytest.raises(tiers.UnknownInput) as refused:
        tiers.parse_tiers(text, known)
    assert str(refused.value) == line


def test_a_model_is_a_named_one_or_a_folders_path():
    assert tiers.parse_models("random, trained,/data/qwen3, ./mine,random") == [
        "random",
        "trained",
        "/data/qwen3",
        "./mine",
    ]


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            "random,qwen3",
            "unknown model 'qwen3' in models='random,qwen3'; known: random, trained, or a folder's path (with a /: ./qwen3)",
        ),
        ("", "models='' names no model; choose from random, trained or a folder's path"),
    ],
)
def test_an_unknown_model_or_none_is_one_line(text, line):
    with pytest.raises(tiers.UnknownInput) as refused:
        tiers.parse_models(text)
    assert str(refused.value) == line
