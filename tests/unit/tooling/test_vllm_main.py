"""The nightly run against vLLM's main branch (tooling/ci/vllm_main.py): which wheel, and its three outcomes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.support import ROOT
from tooling.ci.vllm_main import fit_outcome, newest_wheel

PAGE = """<!DOCTYPE html><html><body>
<a href="../../1111/vllm-0.33.1rc1.dev200%2Bg1111.cu130-cp38-abi3-manylinux_2_31_x86_64.whl#sha256=aa">x</a>
<a href="../../2222/vllm-0.33.1rc1.dev201%2Bg2222.cu130-cp38-abi3-manylinux_2_31_aarch64.whl">arm</a>
<a href="../../3333/vllm-0.33.1rc1.dev202%2Bg3333.cpu-cp38-abi3-manylinux_2_31_x86_64.whl">cpu</a>
<a href="../../4444/vllm-0.33.1rc1.dev199%2Bg4444.cu130-cp38-abi3-manylinux_2_31_x86_64.whl">older</a>
<a href="../../5555/vllm-0.33.0-cp38-abi3-manylinux_2_31_x86_64.whl">release</a>
</body></html>"""
INDEX = "https://wheels.vllm.ai/nightly/vllm/"


def test_the_newest_cuda_x86_wheel_of_main_is_taken():
    assert newest_wheel(PAGE, INDEX) == (
        "https://wheels.vllm.ai/1111/vllm-0.33.1rc1.dev200%2Bg1111.cu130-cp38-abi3-manylinux_2_31_x86_64.whl"
    )


def test_the_index_is_read_over_http_and_a_page_without_a_wheel_is_one_line(tmp_path):
    pages = {"/nightly/vllm/": PAGE.replace("../../", "https://wheels.vllm.ai/"), "/empty/vllm/": "<html></html>"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.get(self.path, "").encode()
            self.send_response(200 if self.path in pages else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    out = tmp_path / "out"

    def wheel(path: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tooling.ci.vllm_main", "wheel", "--index", base + path],
                              cwd=ROOT, capture_output=True, text=True, check=False,
                              env={"PATH": "/usr/bin:/bin", "GITHUB_OUTPUT": str(out)})  # fmt: skip

    try:
        good = wheel("/nightly/vllm/")
        assert good.returncode == 0 and out.read_text().startswith("url=https://wheels.vllm.ai/1111/vllm-0.33.1rc1")
        empty = wheel("/empty/vllm/")
        assert empty.returncode == 2 and empty.stderr.strip().endswith("no x86_64 CUDA wheel of vLLM linked there")
        missing = wheel("/gone/vllm/")
        assert missing.returncode == 2 and "cannot read vLLM's nightly index" in missing.stderr
    finally:
        server.shutdown()


def test_fits_no_longer_fits_and_no_probe_are_told_apart(tmp_path):
    report = tmp_path / "fit.json"
    report.write_text(
        json.dumps({"fits": True, "version": "0.34.0.dev5", "moved": [], "checked": ["6 of 6 modules import"]})
    )
    assert fit_outcome(report, 0) == {"fits": "true", "why": "moegate fits vLLM 0.34.0.dev5: 6 of 6 modules import"}
    report.write_text(json.dumps({"fits": False, "version": "0.34.0.dev5", "moved": ["a.b is gone", "c moved"]}))
    assert fit_outcome(report, 0) == {
        "fits": "false",
        "why": "moegate no longer fits vLLM 0.34.0.dev5: a.b is gone; c moved",
    }
    out = fit_outcome(tmp_path / "never-written.json", 1)
    assert out["fits"] == "false" and out["why"].startswith("the probe never ran (nox -s fit exit 1)")
