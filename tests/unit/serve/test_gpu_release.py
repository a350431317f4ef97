"""A stopped server waits for its own processes to leave the GPU, never for the whole GPU's memory to fall."""

from __future__ import annotations

import subprocess
import sys
import time

from moegate.serve import server
from moegate.serve.processes import group_members, stop_group


def test_the_wait_ends_at_once_when_only_other_processes_hold_the_gpu(monkeypatch):
    # the pair's other servers and another leg hold the GPU: on the H200 rehearsal the old wait on the total ran
    # its whole 120 s for each server
    monkeypatch.setattr(server, "gpu_pids", lambda: {111, 222})
    t0 = time.monotonic()
    server.wait_gpu_released({333, 334}, timeout_s=30, poll_s=0.01)
    assert time.monotonic() - t0 < 1


def test_the_wait_lasts_while_the_servers_own_processes_hold_memory(monkeypatch):
    answers = [{111, 333}, {111, 333}, {111}]
    calls: list[set[int]] = []

    def held() -> set[int]:
        calls.append(answers[min(len(calls), len(answers) - 1)])
        return calls[-1]

    monkeypatch.setattr(server, "gpu_pids", held)
    server.wait_gpu_released({333}, timeout_s=30, poll_s=0.01)
    assert len(calls) == 3
    calls.clear()
    answers[:] = [{333}]  # never released: bounded by the timeout
    t0 = time.monotonic()
    server.wait_gpu_released({333}, timeout_s=0.2, poll_s=0.01)
    assert 0.2 <= time.monotonic() - t0 < 2 and len(calls) > 2


def test_without_nvidia_smi_there_is_nothing_to_wait_for(monkeypatch):
    monkeypatch.setattr(server, "gpu_pids", lambda: None)
    t0 = time.monotonic()
    server.wait_gpu_released({1}, timeout_s=30)
    assert time.monotonic() - t0 < 1


def test_group_members_are_the_processes_of_a_session_and_none_once_it_is_stopped():
    parent = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    proc = subprocess.Popen([sys.executable, "-c", parent + "time.sleep(60)"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(group_members(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = group_members(proc.pid)
        assert proc.pid in members and len(members) == 2
    finally:
        stop_group(proc, grace_s=2)
    assert group_members(proc.pid) == set()
