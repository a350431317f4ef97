"""A tier's run watched and judged, with real processes: a child that prints a real-looking CUDA out-of-memory
traceback (or a planted bug's assertion) and exits 1, a neighbour that is a real process not the tier's own, and a
stand-in NVML reader that lists who holds the GPU's memory (this machine has no GPU). What is under test is the part
that is real here: the run, the output kept, whose process is whose, the verdict and the retry."""

from __future__ import annotations

import functools
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

from moegate.core.faults import FAIL, PASS, RUNNER_FAULT, Attempt, GpuProcess, Outcome, classify
from moegate.preflight.attempts import retry_once, run_watched
from moegate.preflight.gpu_processes import Watch, gpu_processes, is_own, parse_compute_apps, unlisted_mib
from tests.support import ROOT
from tests.support.faults import BUG, OOM_HUGE, OOM_TRACEBACK, neighbour

MARKER = "moegate-fake-tier"


def _tier(tmp_path: Path, body: str) -> list[str]:
    """A child Python whose command line carries ``MARKER`` (so the stand-in reader can find it) running ``body``."""
    script = tmp_path / f"{MARKER}.py"
    script.write_text(textwrap.dedent(body))
    return [sys.executable, str(script)]


def _procs_named(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _reader(tmp_path: Path, *hogs: int):
    """NVML as a stand-in: the tier's own processes (found by their command line, which names this test's own
    folder) hold 8 GiB each, each hog 70."""

    def read() -> list[GpuProcess]:
        own = [GpuProcess(p, 8 * 1024.0) for p in _procs_named(f"{tmp_path}/{MARKER}")]
        return own + [GpuProcess(h, 70 * 1024.0) for h in hogs]

    return read


OOM_CHILD = f"""
    import sys, time
    time.sleep(0.6)  # long enough for the watch to see it
    print("collected 48 items", flush=True)
    print({OOM_TRACEBACK!r}, file=sys.stderr, flush=True)
    sys.exit(1)
"""


def _judge(tmp_path: Path, body: str, *hogs: int) -> tuple[Outcome, str]:
    echo = io.StringIO()
    ran = run_watched(
        _tier(tmp_path, body),
        cwd=tmp_path,
        env=dict(os.environ),
        reader=_reader(tmp_path, *hogs),
        interval_s=0.1,
        echo=echo,
    )
    return classify(Attempt(ran.status, (), ran.output, ran.others)), echo.getvalue()


def test_an_out_of_memory_error_beside_another_process_is_a_runner_fault_that_names_the_neighbour(tmp_path):
    with neighbour() as hog:
        outcome, echoed = _judge(tmp_path, OOM_CHILD, hog)
    assert outcome.verdict == RUNNER_FAULT
    assert outcome.cause.startswith(f"out of memory while 1 other process(es) held 70.0 GiB of its GPU (pid {hog} 70.0")
    assert "collected 48 items" in echoed and "torch.OutOfMemoryError" in echoed  # passed through as it came


def test_the_same_error_with_only_the_tiers_own_processes_on_the_gpu_is_a_fail(tmp_path):
    """The child itself holds 8 GiB in the reader's list: its own, by the token in its environment."""
    outcome, _ = _judge(tmp_path, OOM_CHILD)
    assert outcome.verdict == FAIL
    assert outcome.cause.startswith("out of memory with the GPU to itself")


def test_a_process_the_tier_starts_and_leaves_behind_in_a_session_of_its_own_is_still_its_own(tmp_path):
    """A server the tier starts through a shell that exits (so it is no longer the tier's descendant), in a session
    of its own (as the e2e tier starts its servers): its environment still carries the attempt's token."""
    body = f"""
        import os, signal, subprocess, sys, time
        started = subprocess.run(
            ["sh", "-c", "{sys.executable} -c 'import time; time.sleep(5)' {tmp_path}/{MARKER}-server >/dev/null 2>&1 & echo $!"],
            capture_output=True, text=True, start_new_session=True, check=True,
        )
        time.sleep(0.6)
        print({OOM_TRACEBACK!r}, flush=True)
        os.kill(int(started.stdout), signal.SIGKILL)
        sys.exit(1)
    """
    outcome, _ = _judge(tmp_path, body)
    assert outcome.verdict == FAIL and outcome.cause.startswith("out of memory with the GPU to itself")


def test_a_planted_bugs_assertion_is_a_fail_beside_a_neighbour(tmp_path):
    body = f"""
        import sys
        print({BUG!r})
        print("FAILED tests/kernels/test_kernel_properties.py::test_output_matches_reference[legacy]")
        sys.exit(1)
    """
    with neighbour() as hog:
        outcome, _ = _judge(tmp_path, body, hog)
    assert outcome == Outcome(FAIL, "exit 1, no failing test named")


def test_an_allocation_larger_than_the_gpu_beside_a_neighbour_is_the_builds_fail(tmp_path):
    body = f"""
        import sys, time
        time.sleep(0.3)
        print({OOM_HUGE!r}, flush=True)
        sys.exit(1)
    """
    with neighbour() as hog:
        outcome, _ = _judge(tmp_path, body, hog)
    assert outcome.verdict == FAIL and outcome.cause.startswith("out of memory: the build asked for 1024.0 GiB")


def test_a_tier_killed_by_sigkill_is_a_lost_runner(tmp_path):
    outcome, _ = _judge(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert outcome == Outcome(RUNNER_FAULT, "lost runner: the tier was killed by SIGKILL")


def test_a_runner_fault_is_retried_once_and_the_retry_is_the_verdict(tmp_path):
    said: list[str] = []
    answers = iter([Outcome(RUNNER_FAULT, "out of memory while ..."), Outcome(PASS, "exit 0")])
    got = retry_once(lambda n: next(answers), said.append, reader=list, wait_s=0)
    assert [o.verdict for o in got] == [RUNNER_FAULT, PASS]
    assert said == ["runner fault: out of memory while ...", "retrying once (the GPU is free)"]
    twice = retry_once(lambda n: Outcome(RUNNER_FAULT, f"fault {n}"), said.append, reader=list, wait_s=0)
    assert [o.cause for o in twice] == ["fault 1", "fault 2"] and said[-1] == "runner fault again: fault 2"
    once = retry_once(lambda n: Outcome(FAIL, "a test failed"), said.append, reader=list, wait_s=0)
    assert once == [Outcome(FAIL, "a test failed")]


def test_the_retry_waits_for_the_neighbour_to_leave_and_says_when_it_did_not(tmp_path):
    said: list[str] = []
    answers = iter([Outcome(RUNNER_FAULT, "x"), Outcome(PASS, "exit 0")])
    with neighbour() as hog:
        retry_once(lambda n: next(answers), said.append, reader=lambda: [GpuProcess(hog, 1024.0)], wait_s=0.3)
    assert said[1] == "retrying once (1 other process(es) still on the GPU after 0.3 s)"


def test_memory_held_before_the_tier_under_no_listed_process_is_anothers(tmp_path):
    """A container's NVML may list no process of another container, while the device's used memory counts it: what
    was in use before the attempt started, beyond the driver's 1-GiB reserve, is another's."""
    for before, verdict in ((30 * 1024.0, RUNNER_FAULT), (600.0, FAIL)):
        ran = run_watched(
            _tier(tmp_path, OOM_CHILD), cwd=tmp_path, env=dict(os.environ), reader=list,
            unlisted=functools.partial(float, before), interval_s=0.1, echo=io.StringIO(),
        )  # fmt: skip
        outcome = classify(Attempt(ran.status, (), ran.output, ran.others))
        assert outcome.verdict == verdict
    assert outcome.cause.startswith("out of memory with the GPU to itself")
    ran = run_watched(_tier(tmp_path, OOM_CHILD), cwd=tmp_path, env=dict(os.environ), reader=list,
                      unlisted=lambda: 30 * 1024.0, interval_s=0.1, echo=io.StringIO())  # fmt: skip
    said = classify(Attempt(ran.status, (), ran.output, ran.others)).cause
    assert said.startswith("out of memory while 1 other process(es) held 29.0 GiB of its GPU (29.0 GiB under no listed")


def test_the_gpus_unlisted_memory_is_read_from_nvidia_smi_where_nvml_has_no_binding(tmp_path, monkeypatch):
    """A stand-in nvidia-smi on PATH answering as the real one does: 30 GiB used on GPU 0, 8 GiB of it listed."""
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\ncase "$1" in\n'
        "  --query-compute-apps=*) echo '4711, 8192, GPU-aaaa' ;;\n"
        "  --query-gpu=index,uuid,memory.used) echo '0, GPU-aaaa, 30720'; echo '1, GPU-bbbb, 512' ;;\n"
        "  --query-gpu=uuid) echo 'GPU-aaaa'; echo 'GPU-bbbb' ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no binding: nvidia-smi answers
    assert unlisted_mib({"CUDA_VISIBLE_DEVICES": "0"}) == 30720 - 8192
    assert unlisted_mib({}) == 30720 + 512 - 8192
    assert gpu_processes({"CUDA_VISIBLE_DEVICES": "1"}) == []


def test_a_gate_stopped_by_sigterm_stops_its_tier_and_everything_the_tier_started(tmp_path):
    """A runner's timeout sends SIGTERM to the gate: the tier (a session of its own) and its children go with it,
    so none is left holding the GPU. Here the gate is a real process running ``run_watched``."""
    tier = tmp_path / "tier.py"
    tier.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    runner = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from moegate.preflight.attempts import run_watched\n"
        f"run_watched([sys.executable, {str(tier)!r}], cwd=Path('.'), env=dict(os.environ), reader=list)\n"
    )
    gate_proc = subprocess.Popen([sys.executable, "-c", runner], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert gate_proc.stdout is not None
    child = int(gate_proc.stdout.readline())
    os.kill(child, 0)  # running
    gate_proc.terminate()
    assert gate_proc.wait(30) == 128 + signal.SIGTERM
    time.sleep(0.2)
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().rpartition(")")[2].split()[0] == "Z"


def test_a_pid_proc_does_not_show_is_anothers_only_if_it_held_memory_before_the_attempt_started():
    """NVML in a container lists host pids: one that appears during the attempt may be the attempt's own (its engine,
    under its host pid) and is not claimed; one listed before the attempt started cannot be its own."""
    hidden = 2**22 + 11  # no such process in this namespace
    first: Iterator[list[GpuProcess]] = iter(
        [[]]
    )  # the first question (before the attempt starts) lists nothing; every later one lists it
    with Watch("t", reader=lambda: next(first, [GpuProcess(hidden, 9000.0)]), interval_s=0.05) as late:
        time.sleep(0.3)
    assert late.others() == ()
    with Watch("t", reader=lambda: [GpuProcess(hidden, 9000.0)], interval_s=0.05) as early:
        time.sleep(0.2)
    assert early.others() == (GpuProcess(hidden, 9000.0),)


def test_whose_process_is_whose_by_token_and_by_descent():
    mine = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(5)"], env={**os.environ, "MOEGATE_ATTEMPT": "t1"}
    )
    try:
        assert is_own(mine.pid, "t1") and is_own(mine.pid, None)  # by its environment; by descent from this process
        assert not is_own(mine.pid, "t2", ancestor=1)
        with neighbour() as hog:
            assert not is_own(hog, "t1") and not is_own(hog, None)
        assert not is_own(2**22 + 7, "t1")  # no such process here: another namespace's, so another's
    finally:
        mine.kill()
        mine.wait()


def test_nvidia_smis_compute_apps_are_read_for_the_visible_gpus_only():
    text = "4711, 71680, GPU-aaaa\n4712, [N/A], GPU-bbbb\n4713, 512, GPU-bbbb\n"
    assert parse_compute_apps(text) == [GpuProcess(4711, 71680.0), GpuProcess(4712, 0.0), GpuProcess(4713, 512.0)]
    assert parse_compute_apps(text, ["1"], ["GPU-aaaa", "GPU-bbbb"]) == [GpuProcess(4712, 0.0), GpuProcess(4713, 512.0)]
    assert parse_compute_apps(text, ["GPU-aaaa"]) == [GpuProcess(4711, 71680.0)]
    assert parse_compute_apps("No running processes found\n") == []
