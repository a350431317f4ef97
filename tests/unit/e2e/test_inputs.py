"""Bad input to the e2e tier gets one clear line: data, prompts, ports, models, builds."""

from __future__ import annotations

import io
import json
import socket
import sys

import pytest

from moegate.builds.planted import make_build
from moegate.e2e import gsm8k_files, prompts
from moegate.e2e.gsm8k_files import DataError
from moegate.serve.build import Build, BuildError
from moegate.serve.server import Server, ServerError, resolve_model


def test_a_gsm8k_file_with_another_checksum_is_refused(tmp_path):
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(DataError, match="sha256"):
        gsm8k_files.gsm8k_file("test.jsonl", tmp_path)


def test_a_missing_gsm8k_file_names_where_it_looked(tmp_path):
    with pytest.raises(DataError, match=f"{tmp_path}.*missing"):
        gsm8k_files.gsm8k_file("train.jsonl", tmp_path)


def _records(*texts: str) -> io.BytesIO:
    recs = [{"id": f"r{i}", "conversations": [{"from": "human", "value": t}]} for i, t in enumerate(texts)]
    raw = json.dumps(recs).encode()
    return io.BytesIO(raw[: raw.rindex(b"}, {") + 1] + b', {"id": "cut')  # truncated like the package's file


def test_complete_records_stop_at_the_cut_and_the_rule_skips_long_or_empty_turns():
    pytest.importorskip("ijson", reason="ShareGPT is read with ijson")
    fh = _records("hi", "   ", "x" * (prompts.MAX_PROMPT_BYTES + 1), "fine", "last one is cut")
    recs = list(prompts.complete_records(fh))
    assert [r["id"] for r in recs] == ["r0", "r1", "r2", "r3"]
    chosen = prompts.choose(iter(recs), 2)
    assert [p.id for p in chosen] == ["r0", "r3"]
    with pytest.raises(DataError, match="only 2"):
        prompts.choose(iter(recs), 3)


def test_a_prompt_whose_text_changed_is_refused(tmp_path):
    ok = prompts.Prompt("a", "hello")
    (tmp_path / "set.json").write_text(json.dumps({"prompts": [{"id": "a", "sha256": ok.sha256}]}))
    prompts.export([ok], tmp_path / "texts.jsonl")
    assert prompts.load(path=tmp_path / "set.json", prompts_file=tmp_path / "texts.jsonl") == [ok]
    prompts.export([prompts.Prompt("a", "hello!")], tmp_path / "texts.jsonl")
    with pytest.raises(DataError, match="hash"):
        prompts.load(path=tmp_path / "set.json", prompts_file=tmp_path / "texts.jsonl")


def test_the_committed_prompt_set_is_well_formed():
    entries = prompts.prompt_set()
    assert len(entries) >= prompts.DEFAULT_PROMPTS
    assert len({e["id"] for e in entries}) == len(entries)
    assert all(len(e["sha256"]) == 64 for e in entries)


def test_a_port_in_use_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        model = tmp_path / "m"
        model.mkdir()
        (model / "config.json").write_text("{}")
        with pytest.raises(ServerError, match=f"port {port} .* in use"):
            Server(Build("b", sys.executable), model, log_path=tmp_path / "log", port=port)


def test_an_unknown_model_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ServerError, match="no such directory"):
        resolve_model(tmp_path / "nope")
    with pytest.raises(ServerError, match="not in the local Hugging Face cache"):
        resolve_model("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8")
    with pytest.raises(ServerError, match="no config.json"):
        resolve_model(tmp_path)


def test_a_build_whose_vllm_does_not_import_is_one_line(tmp_path):
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text(
        "import os\nraise ImportError(os.environ.get('STANDIN_SAYS', 'the build env was not passed'))\n"
    )  # a stand-in vLLM in the build's own site, whose import fails with what the build's env says
    python = make_build(tmp_path / "build", sys.executable, sites=(str(tmp_path / "site"),))
    with pytest.raises(BuildError, match="vLLM does not import .*: ImportError: a broken stand-in$"):
        Build("base", str(python), {"STANDIN_SAYS": "a broken stand-in"}).describe()
    with pytest.raises(BuildError, match="no interpreter"):
        Build("base", str(tmp_path / "python")).describe()


def test_builds_of_one_interpreter_and_environment_are_described_once(tmp_path):
    """The same build served twice (or with other flags) is one interpreter: its description, mostly an import of
    vLLM, is read once; another environment is another description."""
    from moegate.e2e.pair import start_and_describe

    (tmp_path / "site" / "vllm").mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text(
        "import os\n__version__ = '0.0.1'\n"
        "with open(os.environ['STANDIN_COUNT'], 'a') as fh:\n    fh.write('imported\\n')\n"
    )  # a stand-in vLLM that counts its imports
    python = str(make_build(tmp_path / "build", sys.executable, sites=(str(tmp_path / "site"),)))
    count = tmp_path / "imports"
    env = {"STANDIN_COUNT": str(count)}
    builds = [Build("base", python, env), Build("pr", python, env, ("--dtype", "float32"))]
    infos = start_and_describe(builds, [])
    assert [i["vllm"] for i in infos] == ["0.0.1", "0.0.1"] and infos[0] is not infos[1]
    assert count.read_text().splitlines() == ["imported"]
    start_and_describe([builds[0], Build("pr", python, {**env, "OTHER": "1"})], [])
    assert len(count.read_text().splitlines()) == 3
