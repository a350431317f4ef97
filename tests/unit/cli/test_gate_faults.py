"""``moegate gate``'s verdict on a failed tier, end to end through its retry path and its page.

The build is a real interpreter (``moegate.builds.planted``) whose site holds a stand-in ``vllm``, a stand-in ``torch``
that sees a CUDA GPU, and a stand-in ``pytest``: the tier command the gate runs (``python -m pytest tests/dispatch
tests/kernels --junitxml=...``) is that package, which follows a plan, one step a call (print a CUDA out-of-memory
traceback, fail a planted bug's assertion, pass), writes the JUnit report pytest would, and exits as pytest would.
Another process on the GPU is a real process that is not the gate's (``tests.support.faults.neighbour``); NVML is a
stand-in reader (``gate.READ_GPU``) that lists it while it lives, this machine having no GPU."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from moegate.builds.planted import make_build
from moegate.cli import gate, gate_page
from moegate.core.case import MoECase, Placement
from moegate.core.check import DispatchMismatch, assert_path
from moegate.core.faults import GpuProcess
from tests.support.faults import BUG, OOM_TRACEBACK, neighbour

KERNEL_TEST = "tests.kernels.test_kernel_properties"
STAND_IN_PYTEST = """
import json, os, signal, sys, time
import xml.etree.ElementTree as ET
from pathlib import Path

here = Path(__file__).parent
plan = json.loads((here / "plan.json").read_text())
calls = here / "calls"
n = len(calls.read_text().splitlines()) if calls.exists() else 0
with calls.open("a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
step = plan[min(n, len(plan) - 1)]
junit = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--junitxml="))
suite = ET.Element("testsuite", name="pytest")
for classname, name, failure in step["cases"]:
    case = ET.SubElement(suite, "testcase", classname=classname, name=name)
    if failure:
        ET.SubElement(case, "failure", message=failure.strip().splitlines()[-1]).text = failure
root = ET.Element("testsuites")
root.append(suite)
time.sleep(0.3)
print(step.get("print", ""), flush=True)
ET.ElementTree(root).write(junit, encoding="utf-8", xml_declaration=True)
if step.get("kill"):
    os.kill(step["kill"], signal.SIGKILL)  # the neighbour's job ends
sys.exit(step["exit"])
"""


def _build(tmp_path: Path, plan: list[dict[str, object]]) -> tuple[Path, Path]:
    """A build whose tier command is the stand-in pytest following ``plan``; its interpreter and the stand-in's folder."""
    site = tmp_path / "site"
    for name, text in {
        "vllm/__init__.py": "import torch\n__version__ = '0.33.1.dev1+g1111111'\n",
        "torch/__init__.py": "__version__ = '2.11.0+cu130'\n\nclass cuda:\n    @staticmethod\n"
        "    def is_available():\n        return True\n",
        "pytest/__init__.py": "",
        "pytest/__main__.py": STAND_IN_PYTEST,
        "pytest/plan.json": json.dumps(plan),
    }.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    return make_build(tmp_path / "build", sys.executable, sites=[str(site)]), site / "pytest"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"


@pytest.fixture
def nvml(monkeypatch):
    """The stand-in NVML: ``held`` lists (pid, MiB) of other processes; each is shown while it lives."""
    held: list[tuple[int, float]] = []
    monkeypatch.setattr(gate, "READ_GPU", lambda: [GpuProcess(p, m) for p, m in held if _alive(p)])
    monkeypatch.setattr(gate, "READ_UNLISTED", lambda: None)  # NVML lists every process here
    monkeypatch.delenv("MOEGATE_DEV", raising=False)
    return held


def _gate(tmp_path: Path, py: Path, tiers: str = "dispatch,kernels", *more: str) -> int:
    return gate.main(
        ["--vllm-python", str(py), "--tiers", tiers, "--junit", str(tmp_path / "r" / "gate.xml"),
         "--page", str(tmp_path / "r" / "gate.md"), "--fault-wait-s", "5", *more]
    )  # fmt: skip


PASSED = [[KERNEL_TEST, "test_output_matches_reference[legacy]", None], ["tests.dispatch.test_x", "test_y", None]]


def _oom(kill: int | None = None) -> dict[str, object]:
    cases = [[KERNEL_TEST, "test_output_matches_reference[legacy]", OOM_TRACEBACK], PASSED[1]]
    return {"cases": cases, "print": "FAILED ... torch.OutOfMemoryError: CUDA out of memory.", "exit": 1, "kill": kill}


def test_an_oom_caused_by_another_process_is_a_runner_fault_and_its_retry_passes(tmp_path, nvml, capsys):
    with neighbour() as hog:
        nvml.append((hog, 70 * 1024.0))
        py, stand_in = _build(tmp_path, [_oom(kill=hog), {"cases": PASSED, "exit": 0}])
        assert _gate(tmp_path, py) == 0
    out = capsys.readouterr().out
    assert (
        f"moegate gate: dispatch + kernels: runner fault: out of memory while 1 other process(es) held 70.0 GiB of its GPU (pid {hog} 70.0 GiB)"
        in out
    )
    assert "moegate gate: dispatch + kernels: retrying once (the GPU is free)" in out
    assert (
        "moegate gate: PASS: vLLM 0.33.1.dev1+g1111111: dispatch + kernels ok (pytest exit 0; retried after a runner fault: out of memory while"
        in out
    )
    assert len((stand_in / "calls").read_text().splitlines()) == 2
    page = (tmp_path / "r" / "gate.md").read_text()
    assert page.splitlines()[0] == "# moegate gate: kernels leg: PASS"
    assert "## Runner faults" in page and f"(pid {hog} 70.0 GiB)" in page and "retried once:\n  **PASS**" in page


def test_a_second_runner_fault_is_not_a_pass_but_runner_fault_again_with_its_own_exit_status(tmp_path, nvml, capsys):
    with neighbour() as hog:
        nvml.append((hog, 70 * 1024.0))
        py, stand_in = _build(tmp_path, [_oom(), _oom()])
        assert _gate(tmp_path, py, "dispatch,kernels", "--fault-wait-s", "0.5") == 3
    out = capsys.readouterr().out
    assert "retrying once (1 other process(es) still on the GPU after 0.5 s)" in out
    assert "moegate gate: dispatch + kernels: runner fault again: out of memory while 1 other process(es)" in out
    assert "moegate gate: RUNNER FAULT: vLLM 0.33.1.dev1+g1111111: dispatch + kernels RUNNER FAULT (" in out
    assert "kernel floor RUNNER FAULT (not judged: the tier's run was a runner fault" in out
    assert len((stand_in / "calls").read_text().splitlines()) == 2
    assert (tmp_path / "r" / "gate.md").read_text().splitlines()[0] == "# moegate gate: kernels leg: RUNNER FAULT"


def test_the_builds_own_oom_on_a_gpu_it_has_to_itself_is_a_fail_and_not_retried(tmp_path, nvml, capsys):
    py, stand_in = _build(tmp_path, [_oom(), {"cases": PASSED, "exit": 0}])
    assert _gate(tmp_path, py) == 1
    out = capsys.readouterr().out
    assert (
        "runner fault" not in out
        and "moegate gate: FAIL: vLLM 0.33.1.dev1+g1111111: dispatch + kernels FAIL (out of memory with the GPU to itself"
        in out
    )
    assert len((stand_in / "calls").read_text().splitlines()) == 1
    page = (tmp_path / "r" / "gate.md").read_text()
    assert page.splitlines()[0] == "# moegate gate: kernels leg: FAIL"
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in page


def test_a_planted_bug_is_a_fail_beside_another_process_and_its_page_gives_the_numbers_and_the_repro(
    tmp_path, nvml, capsys
):
    bug = [[KERNEL_TEST, "test_host_resident_weights_take_sorted_path_on_gpu[legacy]", BUG], PASSED[1]]
    with neighbour() as hog:
        nvml.append((hog, 70 * 1024.0))
        py, stand_in = _build(tmp_path, [{"cases": bug, "exit": 1}, {"cases": PASSED, "exit": 0}])
        assert _gate(tmp_path, py) == 1
    assert "runner fault" not in capsys.readouterr().out
    assert len((stand_in / "calls").read_text().splitlines()) == 1
    page = (tmp_path / "r" / "gate.md").read_text()
    assert page.splitlines()[0] == "# moegate gate: kernels leg: FAIL"
    case = '{"apply_router_weight_on_input":false,"dtype":"bfloat16","num_experts":8,"num_tokens":3,"top_k":2}'
    assert (
        "### 1. `tests/kernels/test_kernel_properties.py::test_host_resident_weights_take_sorted_path_on_gpu[legacy]`"
        in page
    )
    assert (
        "- **ran:** the legacy entrypoint, path sorted, dtype bfloat16, placement=w13-host tokens=3 top_k=2 experts=8"
        in page
    )
    assert "- **numbers:** max |out-ref|=0.412, worst err/tol=57.3, rel max err=38.112%" in page
    assert "- **at the worst element:** reference 0.523438, kernel 0.935547, tolerance 0.00719" in page
    assert f"{py} -m moegate repro --kernels '{case}' --entrypoint legacy" in page


def _mismatch_text() -> str:
    """The dispatch tier's own failure for a host-resident case that took the naive path (vLLM 0.32.0's bug)."""

    class Naive:
        def run(self, case, entrypoint):
            return type("Obs", (), {"path": "naive"})()

    case = MoECase(num_tokens=1, top_k=1, num_experts=8, placement=Placement(True, False))
    with pytest.raises(DispatchMismatch) as err:
        assert_path(Naive(), case, "legacy")
    return f"tests/dispatch/test_dispatch_properties.py:40: in test_path\n{err.value}"


@pytest.mark.parametrize("dev", [False, True], ids=["a vLLM developer's run", "moegate's own run"])
def test_a_dispatch_failure_page_says_what_the_spec_required_what_ran_and_how_to_reproduce_it(
    tmp_path, nvml, monkeypatch, dev
):
    if dev:
        monkeypatch.setenv("MOEGATE_DEV", "1")
    text = _mismatch_text()
    cases = [["tests.dispatch.test_dispatch_properties", "test_path_matches_spec[legacy]", text]]
    py, _ = _build(tmp_path, [{"cases": cases, "exit": 1}])
    assert _gate(tmp_path, py, "dispatch") == 1
    page = (tmp_path / "r" / "gate.md").read_text()
    assert page.splitlines()[0] == "# moegate gate: dispatch leg: FAIL"
    assert "- **spec requires:** sorted (host-resident weights (w13-host))" in page
    assert "- **ran:** the legacy entrypoint took **naive**" in page
    assert "- **case:** placement w13-host, 1 token(s), top_k 1, 8 experts" in page
    assert f"{py} -m moegate repro '{{" in page and "' --entrypoint legacy" in page
    assert ("@example(case=MoECase.from_dict(" in page) is dev and ("pin it:" in text) is dev
    assert not [p for p in (tmp_path / "r").iterdir() if p.name.endswith(".tmp")]


def test_a_page_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    page = tmp_path / "gate.md"
    gate_page.write(page, "# moegate gate: dispatch leg: PASS\n")

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        gate_page.write(page, "# moegate gate: dispatch leg: FAIL\n" + "x" * 10000)
    assert page.read_text() == "# moegate gate: dispatch leg: PASS\n"
    assert [p.name for p in tmp_path.iterdir()] == ["gate.md"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--vllm-python", "/nonexistent/bin/python"], "moegate gate: --vllm-python /nonexistent/bin/python: no such"),
        (
            ["--vllm-python", sys.executable, "--fault-wait-s", "-1"],
            "moegate gate: --min-kernel-tests and --fault-wait-s",
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_no_page(tmp_path, capsys, argv, says):
    assert gate.main([*argv, "--page", str(tmp_path / "gate.md")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(says)
    assert not (tmp_path / "gate.md").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="shows the no-GPU line; this machine has a GPU")
def test_the_kernel_repro_the_page_prints_parses_and_without_a_gpu_says_so_in_one_line(capsys):
    from moegate.cli import repro

    case = MoECase(num_tokens=3, top_k=2, num_experts=8, placement=Placement(True, False)).to_json()
    assert repro.main(["--kernels", case, "--entrypoint", "legacy"]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "moegate repro: --kernels runs the case on a CUDA GPU, and torch here sees none"
    )
