"""moegate.core.faults: each clause decides the failures it is for, in its order, with its cause in the words a
runner's maintainer and a pull request's author each act on."""

from __future__ import annotations

import pytest

from moegate.core.faults import (
    CLAUSES,
    EXIT_STATUS,
    FAIL,
    PASS,
    RUNNER_FAULT,
    Attempt,
    Failure,
    GpuProcess,
    classify,
)
from tests.support.faults import BUG, FALLEN_OFF, ILLEGAL_ADDRESS, OLD_DRIVER, OOM, OOM_HUGE, OOM_TRACEBACK

HOG = (GpuProcess(4711, 70 * 1024.0),)
OOM_TEST = Failure("tests/kernels/test_kernel_properties.py::test_output_matches_reference[legacy]", OOM_TRACEBACK)
BUG_TEST = Failure("tests/kernels/test_kernel_properties.py::test_host_resident_weights_take_sorted_path_on_gpu", BUG)


def test_exit_0_is_a_pass_whatever_the_output_says():
    assert classify(Attempt(0, (), OOM, HOG)).verdict == PASS


def test_an_out_of_memory_error_while_another_process_holds_the_gpu_is_a_runner_fault_naming_it():
    outcome = classify(Attempt(1, (OOM_TEST,), "", HOG))
    assert outcome.verdict == RUNNER_FAULT and outcome.exit_status == 3
    assert outcome.cause.startswith("out of memory while 1 other process(es) held 70.0 GiB of its GPU (pid 4711 70.0")
    assert "GiB): torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has" in outcome.cause


def test_the_builds_own_out_of_memory_error_on_a_gpu_it_has_to_itself_is_a_fail():
    outcome = classify(Attempt(1, (OOM_TEST,), "", ()))
    assert outcome.verdict == FAIL and outcome.exit_status == 1
    assert outcome.cause.startswith("out of memory with the GPU to itself (no other process held memory on it)")


def test_an_allocation_no_gpu_of_this_size_holds_is_the_builds_even_beside_another_process():
    """1,024 GiB asked, 1.06 free and the neighbour's 70: it would not have fit had the GPU been the build's alone."""
    outcome = classify(Attempt(1, (Failure("t", OOM_HUGE),), "", HOG))
    assert outcome.verdict == FAIL
    assert outcome.cause == (
        "out of memory: the build asked for 1024.0 GiB, more than the 1.1 GiB free and the 70.0 GiB the other"
        " processes held together"
    )


def test_an_out_of_memory_error_where_nvml_cannot_say_who_held_the_memory_is_a_fail():
    assert classify(Attempt(1, (OOM_TEST,), "", None)).cause.startswith("out of memory, and NVML could not say")


def test_a_planted_bug_is_a_fail_beside_another_process_and_beside_an_out_of_memory_error():
    for failures in ((BUG_TEST,), (OOM_TEST, BUG_TEST)):
        outcome = classify(Attempt(1, failures, "", HOG))
        assert outcome.verdict == FAIL
        assert outcome.cause == f"{BUG_TEST.name} failed"


def test_vllms_start_up_check_for_free_memory_counts_as_out_of_memory():
    said = (
        "ValueError: Free memory on device cuda:0 (3.2/79.19 GiB) on startup is less than desired GPU memory"
        " utilization (0.15, 11.88 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )
    assert classify(Attempt(1, (Failure("t", said),), "", HOG)).verdict == RUNNER_FAULT
    assert classify(Attempt(1, (Failure("t", said),), "", ())).verdict == FAIL


@pytest.mark.parametrize(
    ("output", "status", "verdict", "cause"),
    [
        (FALLEN_OFF, 1, RUNNER_FAULT, "driver error: Xid 79 (the GPU has fallen off the bus)"),
        (OLD_DRIVER, 1, RUNNER_FAULT, "driver error: RuntimeError: The NVIDIA driver on your system is too old"),
        (
            "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
            1,
            RUNNER_FAULT,
            "driver error",
        ),
        (ILLEGAL_ADDRESS, 1, FAIL, "a kernel of the build faulted: torch.AcceleratorError: CUDA error: an illegal"),
        ("collected 40 items\n...", -9, RUNNER_FAULT, "lost runner: the tier was killed by SIGKILL"),
        ("Terminated", 143, RUNNER_FAULT, "lost runner: the tier was killed by SIGTERM"),
        ("Fatal Python error: Segmentation fault", -11, FAIL, "exit -11, no failing test named"),
        ("##[error]The runner has received a shutdown signal.", 1, RUNNER_FAULT, "lost runner: ##[error]The runner"),
    ],
    ids=[
        "Xid 79",
        "old driver",
        "device busy",
        "illegal address (Xid 31)",
        "SIGKILL",
        "SIGTERM",
        "segfault",
        "shutdown",
    ],
)
def test_driver_errors_and_lost_runners_are_runner_faults_and_a_kernels_own_fault_is_a_fail(
    output, status, verdict, cause
):
    outcome = classify(Attempt(status, (), output, HOG))
    assert outcome.verdict == verdict and outcome.cause.startswith(cause)


def test_a_hardware_xid_outranks_the_kernel_fault_it_causes_and_an_apps_own_xid_does_not():
    """Xid 79 first (the card left the bus; every kernel after it faults), Xid 31 (an MMU fault) is the kernel's."""
    both = f"{FALLEN_OFF}\n{ILLEGAL_ADDRESS}"
    assert classify(Attempt(1, (), both, ())).verdict == RUNNER_FAULT
    assert classify(Attempt(1, (), ILLEGAL_ADDRESS, ())).verdict == FAIL


def test_the_clauses_run_in_the_documented_order_and_every_verdict_has_its_own_exit_status():
    names = [c.__name__ for c in CLAUSES]
    assert names == [
        "passed", "hardware_xid", "kernel_fault", "driver_error", "lost_runner", "not_out_of_memory",
        "oom_unknown_others", "oom_alone", "oom_too_large_anyway", "oom_beside_others",
    ]  # fmt: skip
    assert EXIT_STATUS == {PASS: 0, FAIL: 1, RUNNER_FAULT: 3}
