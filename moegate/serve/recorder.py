"""A pass-through in front of a server that keeps the token ids it generated for another client (lm-eval).

lm-eval sends GSM8K's prompts as text and keeps only the text it gets back, so the gate has no record of
which tokens a build decoded; re-tokenizing the text is no substitute (measured on the H200: the trained
model writes ``4`` then ``3`` where the text re-tokenizes as ``43``, and a divergence re-scored on that
context is judged on positions the server never decoded; ``results/e2e-h200-scored.md``). The recorder
forwards every request unchanged but for ``return_token_ids`` (vLLM's completions field, in 0.32.0 and
0.33.0), writes each choice's prompt hash, text, prompt ids and generated ids to a JSONL file, and
returns the response without those ids, so the client reads what it would have read from the server.
Requests are forwarded as they come, concurrently, so the server batches them as it would have.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

from moegate.core.hashing import text_sha256

COMPLETIONS = "/v1/completions"
TIMEOUT_S = 3600.0


class Recorder:
    """``with Recorder(upstream, log) as rec:`` point the client at ``rec.url``; ``log`` gets one line a choice."""

    def __init__(self, upstream: str, log: Path) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.log = log
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the recorder is not running"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text("")
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="moegate-recorder", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def forward(self, method: str, path: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, str, bytes]:
        """The upstream's status, content type and body (completions: ids recorded, then removed)."""
        request: dict[str, Any] = {}
        if method == "POST" and path.split("?")[0] == COMPLETIONS:
            request = json.loads(body)
        # a streamed answer (lm-eval's does not stream) or one without a prompt passes through as it is
        record = isinstance(request, dict) and "prompt" in request and not request.get("stream")
        if record:
            request["return_token_ids"] = True
            body = json.dumps(request).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
        try:
            conn.request(method, path, body=body or None, headers={**headers, "Content-Length": str(len(body))})
            resp = conn.getresponse()
            status, kind, data = resp.status, resp.getheader("Content-Type", "application/json"), resp.read()
        finally:
            conn.close()
        if record and status == 200:
            reply = json.loads(data)
            self._keep(request["prompt"], reply)
            data = json.dumps(reply).encode()
        return status, kind, data

    def _keep(self, prompt: Any, reply: dict[str, Any]) -> None:
        prompts = prompt if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt) else [prompt]
        lines = []
        for choice in reply.get("choices", []):
            ids, prompt_ids = choice.pop("token_ids", None), choice.pop("prompt_token_ids", None)
            text_prompt = prompts[choice.get("index", 0)] if choice.get("index", 0) < len(prompts) else None
            if ids is None or not isinstance(text_prompt, str):
                continue
            # keyed as the GSM8K records key their prompts
            entry = {"prompt_sha256": text_sha256(text_prompt), "text": choice.get("text", "")}
            lines.append(json.dumps({**entry, "prompt_ids": prompt_ids, "ids": ids}))
        reply.pop("prompt_token_ids", None)
        if lines:
            with self._lock, open(self.log, "a", encoding="utf-8") as fh:
                fh.write("".join(line + "\n" for line in lines))


def _handler(rec: Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _pass(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {
                k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept", "authorization")
            }
            try:
                status, kind, data = rec.forward(method, self.path, body, headers)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                status, kind = 502, "application/json"
                data = json.dumps({"error": f"moegate recorder: the server did not answer: {exc}"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # http.server's names
            self._pass("GET")

        def do_POST(self) -> None:
            self._pass("POST")

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def read(log: Path) -> Iterator[dict[str, Any]]:
    """The recorded choices, in the order they came back."""
    with open(log, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def decoded_by_prompt(log: Path) -> dict[str, dict[str, Any]]:
    """prompt sha256 -> the one recorded choice for it (a prompt answered twice, differently, is left out)."""
    seen: dict[str, dict[str, Any]] = {}
    clash: set[str] = set()
    for entry in read(log):
        key = entry["prompt_sha256"]
        if key in seen and (seen[key]["ids"], seen[key]["text"]) != (entry["ids"], entry["text"]):
            clash.add(key)
        seen.setdefault(key, entry)
    return {k: v for k, v in seen.items() if k not in clash}
