"""The e2e goldens: keyed by what changes numerics, missing means fail with the bless command,
changed only by bless, and a broken file is an error that names its line."""

from __future__ import annotations

import dataclasses
import json

import pytest

from moegate.e2e import golden_records
from moegate.e2e.golden_records import GoldenError, Key

KEY = Key("greedy", "0.33.0", "NVIDIA H200", "bfloat16", "abcdef0123456789", ("--enforce-eager",), "p2-t4", 4)
RECORDS = [{"prompt_id": "a", "token_ids": [1, 2, 3, 4]}, {"prompt_id": "b", "token_ids": [5, 6, 7, 8]}]
PROV = {"vllm": "0.33.0", "device": "NVIDIA H200"}


def test_the_key_separates_what_changes_numerics():
    changed = [
        dataclasses.replace(KEY, vllm="0.32.0"), dataclasses.replace(KEY, device="cpu-avx2"),
        dataclasses.replace(KEY, dtype="float32"), dataclasses.replace(KEY, model_hash="ffff"),
        dataclasses.replace(KEY, flags=("--offload-backend", "uva")), dataclasses.replace(KEY, in_flight=1),
        dataclasses.replace(KEY, size="p8-t4"),
    ]  # fmt: skip
    slugs = {k.slug for k in (KEY, *changed)}
    assert len(slugs) == 8
    assert all("/" not in s and " " not in s for s in slugs)


def test_a_missing_golden_fails_with_the_bless_command_and_writes_only_obtained(tmp_path):
    out = golden_records.check(KEY, PROV, RECORDS, directory=tmp_path)
    assert out.status == "missing" and "nox -s bless -- e2e" in out.message
    assert not KEY.path(tmp_path).exists()
    assert KEY.path(tmp_path).with_name(KEY.path(tmp_path).name + ".obtained").exists()


def test_bless_writes_then_matches_and_a_change_is_caught(tmp_path):
    blessed = golden_records.check(KEY, PROV, RECORDS, bless=True, directory=tmp_path)
    assert blessed.status == "blessed" and "2 new or changed" in blessed.message
    # provenance is not compared: another date or torch still matches
    assert golden_records.check(KEY, {**PROV, "torch": "other"}, RECORDS, directory=tmp_path).status == "match"
    moved = [RECORDS[0], {"prompt_id": "b", "token_ids": [5, 6, 7, 9]}]
    out = golden_records.check(KEY, PROV, moved, directory=tmp_path)
    assert out.status == "differs" and out.records == RECORDS
    # the golden itself did not move
    assert golden_records.read(KEY.path(tmp_path))[1] == RECORDS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"provenance": {}}\n{"prompt_id": "a"}', "truncated"),
        ('{"provenance": {}}\n{"prompt_id": "a", \n', "line 2: not JSON"),
        ('{"provenance": {}}\n[1, 2]\n', "line 2: not a JSON object"),
        ('{"prompt_id": "a"}\n', "line 1: no provenance"),
        ("", "truncated"),
    ],
)
def test_a_broken_golden_is_an_error_naming_the_line(tmp_path, text, expected):
    path = KEY.path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(GoldenError, match=expected):
        golden_records.read(path)


def test_render_is_one_json_object_a_line_with_provenance_first():
    lines = golden_records.render(PROV, RECORDS).splitlines()
    assert json.loads(lines[0]) == {"provenance": PROV}
    assert [json.loads(x) for x in lines[1:]] == RECORDS


def test_blessing_the_same_records_again_leaves_the_golden_alone(tmp_path):
    golden_records.check(KEY, PROV, RECORDS, bless=True, directory=tmp_path)
    before = KEY.path(tmp_path).read_bytes()
    again = golden_records.check(KEY, {**PROV, "date": "later"}, RECORDS, bless=True, directory=tmp_path)
    assert "unchanged" in again.message and KEY.path(tmp_path).read_bytes() == before
