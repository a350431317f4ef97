"""Decode time a token per request and per start (moegate/ab/latency.py), from vLLM-shaped result dicts: the
per-request form ``--save-detailed`` keeps, and the summary form of runs written before it."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from moegate.ab.latency import PER_REQUEST, SUMMARY, by_level, from_result, request_decode_ms, start_decode
from tests.support.ab import StubBench, make_driver, reset_stubs, set_result_fields, tok_s  # noqa: F401 (autouse)


def detailed(latencies, ttfts, lens, **extra):
    return {"latencies": latencies, "ttfts": ttfts, "output_lens": lens, **extra}


def test_a_requests_decode_time_is_its_time_after_the_first_token_over_the_tokens_after_it():
    result = detailed([1.05, 2.05, 0.0], [0.05, 0.05, 0.0], [101, 201, 0])  # the third request failed
    assert request_decode_ms(result) == pytest.approx([10.0, 10.0])
    assert request_decode_ms({"latencies": [1.0]}) is None  # a run without --save-detailed


def test_the_start_figure_is_the_median_and_must_agree_with_vllms_median_tpot():
    lat = [0.05 + 0.127 * k for k in (1.0, 1.1, 0.9, 1.3)]
    times = [1000 * (x - 0.05) / 127 for x in lat]
    got = from_result(detailed(lat, [0.05] * 4, [128] * 4, median_tpot_ms=statistics.median(times)), "r.json")
    assert got is not None
    median, n, sd, source, residuals = got
    assert median == pytest.approx(statistics.median(times)) and (n, source) == (4, PER_REQUEST)
    assert sd == pytest.approx(statistics.stdev(math.log(t) for t in times))
    assert len(residuals) == 4 and sorted(residuals)[1] < 0 < sorted(residuals)[2]
    with pytest.raises(ValueError, match="not what this reader takes them for"):
        from_result(detailed(lat, [0.05] * 4, [128] * 4, median_tpot_ms=99.0), "r.json")


def test_a_run_without_per_request_fields_takes_vllms_median_and_scales_its_std():
    got = from_result({"median_tpot_ms": 24.0, "mean_tpot_ms": 24.1, "std_tpot_ms": 0.241, "completed": 12}, "r.json")
    assert got is not None
    median, n, sd, source, residuals = got
    assert (median, n, source, residuals) == (24.0, 12, SUMMARY, ())
    assert sd == pytest.approx(0.01 * math.sqrt(12 / 11))
    assert from_result({"output_throughput": 5.0}, "r.json") is None


def test_a_non_positive_decode_time_is_refused_with_the_file():
    with pytest.raises(ValueError, match=r"bad\.json: a request's decode time"):
        from_result(detailed([0.04], [0.05], [10]), "bad.json")


def test_every_good_start_gets_a_figure_per_level_and_a_run_without_files_is_left_out(tmp_path):
    run = make_driver(tmp_path, StubBench(tok_s), starts=2, levels=(1, 2)).run()
    decode = start_decode(run, tmp_path / "run")
    assert sorted(decode) == [(i, c) for i in range(4) for c in (1, 2)]
    assert all(d.source == PER_REQUEST and d.requests == run.prompts[d.concurrency] for d in decode.values())
    sides = by_level(decode, 2)
    assert [d.index for d in sides["base"]] == [0, 3] and [d.index for d in sides["pr"]] == [1, 2]
    set_result_fields(tmp_path / "run", run, (1, 2), {}, {"latencies": None, "median_tpot_ms": 7.0})
    decode = start_decode(run, tmp_path / "run")
    assert {d.median_ms for d in decode.values()} == {7.0} and {d.source for d in decode.values()} == {SUMMARY}
    (tmp_path / "run" / run.starts[0].folder / "measured-c1.json").unlink()
    assert (0, 1) not in start_decode(run, tmp_path / "run")
    path = tmp_path / "run" / run.starts[1].folder / "measured-c1.json"
    path.write_text(json.dumps({"completed": 4}))
    assert (1, 1) not in start_decode(run, tmp_path / "run")
