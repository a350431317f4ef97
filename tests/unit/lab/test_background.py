"""lab/gpu/background.sh, which lets a device job outlive its call: run here on a job of a few lines. A wait that ends
before its job brings back what the job has written so far (a call cut by the device budget still returns the pairs
that ended); a later wait brings back the rest and the job's exit status; bad input is one line and exit 2."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import ROOT

SCRIPT = ROOT / "lab" / "gpu" / "background.sh"
JOB = 'echo "data: $(cat $DATA/x)"; mkdir -p $OUT/p; echo a >$OUT/p/a; for _ in $(seq 150); do [ -f $DATA/../go ] && break; sleep 0.2; done; echo b >$OUT/p/b; exit 3'


def _bg(tmp_path: Path, out: str, *args: str, wait_s: str = "30") -> subprocess.CompletedProcess[str]:
    (tmp_path / out).mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "OUT": str(tmp_path / out), "DATA": str(tmp_path / "data"),
           "WAIT_S": wait_s, "POLL_S": "0.2"}  # fmt: skip
    return subprocess.run(
        ["bash", str(SCRIPT), *args], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def _unpack(out: Path, name: str) -> Path:
    """The call's parts joined and unpacked, as here after a call: ``cat NAME-out.tar.* | tar -x``."""
    parts = sorted(out.glob(f"{name}-out.tar.*"))
    assert parts and len(parts) + 1 <= 8, [p.name for p in out.iterdir()]  # the device brings back 8 files a call
    dest = out / "unpacked"
    dest.mkdir(exist_ok=True)
    subprocess.run(f"cat {' '.join(str(p) for p in parts)} | tar -x -C {dest}", shell=True, check=True)
    return dest


def test_a_wait_brings_back_what_the_job_wrote_so_far_and_a_later_one_the_rest(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x").write_text("carried\n")
    started = _bg(tmp_path, "out0", "start", "job", "bash", "-c", JOB)
    assert started.returncode == 0 and "job: started in the background" in started.stdout, started.stderr
    job = tmp_path / "home" / "bg" / "job"
    assert (job / "tree" / "lab" / "gpu" / "background.sh").is_file() and not (job / "tree" / ".git").exists()
    again = _bg(tmp_path, "out0", "start", "job", "true")
    assert (
        again.returncode == 2
        and again.stderr.strip() == "background.sh start job: still running (background.sh wait job)"
    )
    first = _bg(tmp_path, "out1", "wait", "job", wait_s="2")
    assert first.returncode == 0 and "job: still running after 2 s" in first.stdout
    got = _unpack(tmp_path / "out1", "job")
    assert (got / "p" / "a").is_file() and not (got / "p" / "b").exists()
    assert "data: carried" in first.stdout  # DATA is the job's own copy
    (job / "go").write_text("")  # $DATA/../go from the job's side
    second = _bg(tmp_path, "out2", "wait", "job")
    assert "job: ended, exit 3" in second.stdout and "data: carried" not in second.stdout  # the log since the last wait
    assert (_unpack(tmp_path / "out2", "job") / "p" / "b").read_text() == "b\n"


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, line in (
        (["go", "job"], "background.sh: usage: background.sh start NAME CMD... | wait NAME"),
        (["start", "a b", "true"], "background.sh start: NAME is letters, digits, '.', '_' or '-', not 'a b'"),
        (["start", "job"], "background.sh start job: no command to run"),
        (
            ["wait", "never"],
            "background.sh wait: never was not started on this machine (background.sh start never CMD...)",
        ),
    ):
        proc = _bg(tmp_path, "out", *args)
        assert (proc.returncode, proc.stderr.strip(), proc.stdout) == (2, line, ""), args


def test_a_job_killed_without_its_exit_status_is_reported_gone_with_exit_3(tmp_path):
    (tmp_path / "data").mkdir()
    assert _bg(tmp_path, "out", "start", "job", "sleep", "60").returncode == 0
    job = tmp_path / "home" / "bg" / "job"
    os.kill(int((job / "pid").read_text()), 9)
    proc = _bg(tmp_path, "out", "wait", "job")
    assert proc.returncode == 3 and "job: gone without an exit status" in proc.stdout
    again = _bg(tmp_path, "out", "start", "job", "true")  # what wait's exit 3 says to do
    assert again.returncode == 0 and "job: started in the background" in again.stdout, again.stderr
    assert "job: ended, exit 0" in _bg(tmp_path, "out", "wait", "job").stdout
