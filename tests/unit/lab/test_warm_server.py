"""lab/gpu/warm_server.py, against a stand-in server (a real process answering ``/health``, no vLLM): it starts
the build's interpreter with the A/B's flags and the memory share last, waits for health, and leaves nothing up."""

from __future__ import annotations

import json
import os
from pathlib import Path

from lab.gpu.warm_server import main
from tests.support.fake_server import fake_python


def _fake(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    return fake_python(tmp_path)


def test_a_warm_start_serves_the_given_flags_with_its_memory_share_last_and_stops(tmp_path, monkeypatch, capsys):
    fake = _fake(tmp_path)
    monkeypatch.setenv("FAKE_ARGV", str(tmp_path / "argv.json"))
    flags = "--max-num-seqs 16 --gpu-memory-utilization 0.5 --offload-backend uva"
    code = main([str(fake), str(tmp_path / "model"), str(tmp_path / "warm.log"), flags, "--util", "0.2"])
    assert code == 0
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[argv.index("--model") + 1] == str(tmp_path / "model")
    # the last one is the one vLLM keeps
    assert argv[-10:] == [*flags.split(), "--gpu-memory-utilization", "0.2", "--kv-cache-memory-bytes", str(2 << 30)]
    assert "healthy in" in capsys.readouterr().out
    assert not (tmp_path / "warm.pgid").exists(), "the stopped server's record stays"


def test_a_server_that_does_not_come_up_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    fake = _fake(tmp_path)
    monkeypatch.setenv("FAKE_ARGV", str(tmp_path / "argv.json"))
    monkeypatch.setenv("FAKE_FAIL", "1")
    assert main([str(fake), str(tmp_path / "model"), str(tmp_path / "warm.log")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no healthy server" in err[0]
    assert "Free memory" in (tmp_path / "warm.log").read_text()
    assert os.path.exists(tmp_path / "argv.json")
