"""moegate.serve.client.post against a real HTTP server on the loopback: a server that dies mid-answer is a
RequestError (the run then reports the dead server), never a traceback. The e2e smoke met it: a server killed while
it wrote a /tokenize answer left ``http.client.IncompleteRead``, which escaped as exit 1 instead of the clean exit 2."""

from __future__ import annotations

import socket
import threading

import pytest

from moegate.serve.client import RequestError, post


def _serve_once(answer: bytes) -> str:
    """A server that reads one request, writes ``answer`` and closes: its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)

    def run() -> None:
        conn, _ = sock.accept()
        conn.recv(65536)
        conn.sendall(answer)
        conn.close()
        sock.close()

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}/tokenize"


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 163\r\n\r\n",  # killed mid-answer
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{"tokens"',  # not JSON
        b"",  # closed before any answer
    ],
    ids=["cut-short", "not-json", "no-answer"],
)
def test_a_server_that_dies_mid_answer_is_a_request_error(answer: bytes) -> None:
    with pytest.raises(RequestError, match="127.0.0.1"):
        post(_serve_once(answer), {"prompt": "x"}, timeout_s=10)


def test_a_whole_answer_comes_back_as_json() -> None:
    body = b'{"tokens": [1, 2]}'
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    assert post(_serve_once(head + body), {"prompt": "x"}, timeout_s=10) == {"tokens": [1, 2]}
