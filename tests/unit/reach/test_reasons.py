"""The reviewed reasons: read strictly, matched by file, function and line, census claims checked."""

from __future__ import annotations

import pytest

from moegate.reach import reasons

GOOD = """
[[reason]]
kind = "hardware"
why = "ROCm"
where = ["*"]
line = "is_rocm"

[[reason]]
kind = "census"
why = "no model quantizes activations to int8"
where = ["a.py::f"]
absent = {kind = "tuned", dtype = "int8_w8a8", lookup = true}
"""


def test_a_reason_covers_branches_by_file_function_and_the_line_they_leave():
    rocm, census = reasons.parse(GOOD)
    assert rocm.covers_branch("x/y.py", "g", "if current_platform.is_rocm():")
    assert not rocm.covers_branch("x/y.py", "g", "if expert_map is not None:")
    assert census.covers_branch("a.py", "f", "anything") and not census.covers_branch("a.py", "h", "anything")
    assert reasons.first([rocm, census], branch=("a.py", "f", "if is_rocm():")) is rocm


def test_a_reason_with_a_list_of_lines_covers_a_branch_leaving_any_of_them_and_no_other():
    (both,) = reasons.parse('[[reason]]\nkind = "scope"\nwhy = "x"\nwhere = ["a.py::f"]\nline = ["is_xpu", "is_tpu"]')
    assert both.covers_branch("a.py", "f", "if is_xpu():") and both.covers_branch("a.py", "f", "elif is_tpu():")
    assert not both.covers_branch("a.py", "f", "if is_cuda():") and not both.covers_branch("b.py", "f", "if is_xpu():")


def test_a_census_reason_is_contradicted_by_a_record_that_matches_what_it_says_is_absent():
    _, census = reasons.parse(GOOD)
    assert reasons.contradicted(census, [{"kind": "tuned", "dtype": "int8_w8a8", "lookup": False}]) == []
    hit = {"kind": "tuned", "dtype": "int8_w8a8", "lookup": True}
    assert reasons.contradicted(census, [hit]) == [hit]


@pytest.mark.parametrize(
    "entry,message",
    [
        ('kind = "maybe"\nwhy = "x"\nwhere = ["*"]', "kind 'maybe' is none of hardware, scope, census"),
        ('kind = "scope"\nwhere = ["*"]', "needs its why"),
        ('kind = "scope"\nwhy = "x"', "covers nothing"),
        ('kind = "census"\nwhy = "x"\nwhere = ["*"]', "states the census fact"),
        ('kind = "scope"\nwhy = "x"\nwhere = ["*"]\nwhen = "later"', "unknown field"),
        ('kind = "scope"\nwhy = "x"\nwhere = ["*"]\nline = ["ok", ""]', "line is a text or a list of texts"),
    ],
)
def test_a_bad_entry_is_refused_with_its_number(entry, message):
    with pytest.raises(reasons.ReasonsError, match=message) as err:
        reasons.parse(GOOD + "\n[[reason]]\n" + entry)
    assert "reasons.toml #3" in str(err.value)


def test_the_committed_reasons_read():
    assert len(reasons.load()) > 10
