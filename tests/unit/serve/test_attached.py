"""A server the run did not start (``--base-url``/``--pr-url``): trusted only when it is the build's and the
model's, and never stopped by the run. Against a stand-in HTTP server here (the real one: tests/e2e)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from moegate.serve.attached import AttachedServer
from moegate.serve.build import Build
from moegate.serve.server import ServerError


def _stand_in(version: str, root: str) -> ThreadingHTTPServer:
    answers = {
        "/health": b"",
        "/version": json.dumps({"version": version}).encode(),
        "/v1/models": json.dumps({"data": [{"id": "served-name", "root": root}]}).encode(),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture
def model(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return tmp_path / "model"


@pytest.fixture
def serve(model) -> Iterator:
    started: list[ThreadingHTTPServer] = []

    def _serve(version: str = "0.32.0", root: str | None = None) -> str:
        httpd = _stand_in(version, str(root or model))
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}"

    yield _serve
    for httpd in started:
        httpd.shutdown()
        httpd.server_close()


BUILD = Build("base", sys.executable)


def test_a_server_of_the_build_and_the_model_is_used_under_its_served_name(serve, model):
    srv = AttachedServer(BUILD, model, serve(), vllm_version="0.32.0")
    with srv:
        assert srv.model_name == "served-name"
        srv.check_alive()
    srv.check_alive()  # leaving the block stopped nothing: whoever started it stops it


def test_a_server_of_another_vllm_release_is_refused_in_one_line(serve, model):
    url = serve(version="0.33.0")
    with pytest.raises(ServerError) as err:
        AttachedServer(BUILD, model, url, vllm_version="0.32.0").start()
    assert str(err.value) == (
        f"server of build base at {url}: serves vLLM 0.33.0, but the build's interpreter imports vLLM 0.32.0"
    )


def test_a_server_of_another_model_is_refused_in_one_line(serve, model, tmp_path):
    url = serve(root=str(tmp_path / "elsewhere"))
    with pytest.raises(ServerError, match=f"serves {tmp_path / 'elsewhere'}, not {model}$"):
        AttachedServer(BUILD, model, url, vllm_version="0.32.0").start()


def test_nothing_listening_is_one_line(model):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: nothing answers there
        with pytest.raises(ServerError, match=rf"^server of build base at http://127.0.0.1:{port}: does not answer"):
            AttachedServer(BUILD, model, f"http://127.0.0.1:{port}", vllm_version=None).start()


def test_a_server_that_goes_away_is_reported_dead(model):
    httpd = _stand_in("0.32.0", str(model))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    srv = AttachedServer(BUILD, model, f"http://127.0.0.1:{httpd.server_address[1]}", vllm_version="0.32.0")
    srv.start()
    httpd.shutdown()
    httpd.server_close()
    with pytest.raises(ServerError, match=r"died \(no answer on /health\)$"):
        srv.check_alive(grace_s=0.5)
