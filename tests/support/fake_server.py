"""A stand-in for vLLM's OpenAI server, for tests that start a real process the way ``Server`` starts vLLM (its own
process group, the build's interpreter) and need only ``/health`` to answer: no vLLM, no model.

``fake_python(folder)`` writes an executable that runs it under this interpreter, whatever arguments it gets. Its
environment steers it: ``FAKE_IGNORE_TERM=1`` ignores SIGTERM (vLLM's server in effect did on the H200,
2026-12-03), ``FAKE_ARGV=PATH`` records its arguments as JSON, ``FAKE_FAIL=1`` prints an error line and exits 1
before serving."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

FAKE_SERVER = textwrap.dedent(
    """
    import http.server, json, os, signal, sys
    if os.environ.get("FAKE_ARGV"):
        open(os.environ["FAKE_ARGV"], "w").write(json.dumps(sys.argv[1:]))
    if os.environ.get("FAKE_FAIL"):
        print("ValueError: Free memory on device cuda:0 is less than desired", flush=True)
        sys.exit(1)
    if os.environ.get("FAKE_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def fake_python(folder: Path) -> Path:
    """``folder/fakepython``, an executable that serves ``/health`` on the ``--port`` it is given."""
    (folder / "fake_server.py").write_text(FAKE_SERVER)
    fake = folder / "fakepython"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} {folder / "fake_server.py"} "$@"\n')
    fake.chmod(0o755)
    return fake
