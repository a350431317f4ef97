"""``moegate gate`` on builds made here: a dev build whose vLLM does not import fails in one line naming it, a wheel
that is not vLLM is refused before any environment is built, a GPU tier without a GPU is one line; the kernel floor
reads the JUnit report. The builds are real interpreters (``moegate.builds.planted``: a venv seeing this Python's
packages and a site first) whose ``vllm`` is a stand-in package in that site: the probe imports it in a process of
its own, as it imports a real one."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from moegate.builds.planted import make_build
from moegate.cli import gate


def _build(tmp_path: Path, init: str) -> Path:
    """An interpreter whose ``import vllm`` runs ``init``."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text(init)
    return make_build(tmp_path / "build", sys.executable, sites=[str(site)])


def test_a_dev_build_whose_vllm_does_not_import_fails_in_one_line_naming_the_build_and_the_error(tmp_path, capsys):
    py = _build(tmp_path, "raise ImportError('libcudart.so.13: cannot open shared object file')\n")
    assert gate.main(["--vllm-python", str(tmp_path / "build"), "--label", "pr 0.33.1.dev2+g2222222"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    why = "ImportError: libcudart.so.13: cannot open shared object file"
    assert err == [f"moegate gate: FAIL: build pr 0.33.1.dev2+g2222222 ({py}): vLLM does not import: {why}"]


def test_a_vllm_that_dies_on_import_with_any_exception_is_a_failure_too(tmp_path, capsys):
    py = _build(tmp_path, "import sys\nsys.exit(3)\n")  # SystemExit: not an ImportError, still no vLLM
    assert gate.main(["--vllm-python", str(py)]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.endswith("vLLM does not import: SystemExit: 3")


def test_a_gpu_tier_where_the_builds_torch_sees_no_gpu_is_one_line(tmp_path, capsys):
    """The build's torch, a stand-in beside its vllm (the real one's import took 20-26 s of the unit tier on the
    2-core machine, and skipped the test on a GPU machine), sees no CUDA GPU; the probe asks it as it asks a real one."""
    (tmp_path / "site" / "torch").mkdir(parents=True)
    (tmp_path / "site" / "torch" / "__init__.py").write_text(
        "__version__ = '2.11.0+cpu'\n\nclass cuda:\n    @staticmethod\n    def is_available():\n        return False\n"
    )
    py = _build(tmp_path, "import torch\n__version__ = '0.33.1.dev1+g1111111'\n")
    assert gate.main(["--vllm-python", str(py), "--tiers", "dispatch,kernels"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"moegate gate: tier kernels needs a CUDA GPU, and torch in {py} sees none"]


def _wheel(path: Path, name: str, version: str) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
    return path


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda d: _wheel(d / "numpy-2.0.0-py3-none-any.whl", "numpy", "2.0.0"), "a wheel of numpy 2.0.0, not of vLLM"),
        (
            lambda d: (d / "vllm-1.0-py3-none-any.whl").write_bytes(b"not a zip") and d / "vllm-1.0-py3-none-any.whl",
            "not a wheel (not a zip archive)",
        ),
        (lambda d: d / "vllm-0.33.1-py3-none-any.whl", "no such wheel"),
    ],
    ids=["another project's wheel", "not a zip", "missing"],
)
def test_a_wheel_that_is_not_vllm_is_refused_in_one_line_before_any_environment_is_built(tmp_path, capsys, make, says):
    wheel = make(tmp_path)
    assert gate.main(["--wheel", str(wheel)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("moegate gate: ") and says in err[0]


def test_a_vllm_wheel_goes_to_nox_with_the_other_options_and_pytests_arguments(tmp_path):
    wheel = _wheel(tmp_path / "vllm-0.33.1.dev1+g1111111-cp38-abi3-linux_x86_64.whl", "vllm", "0.33.1.dev1+g1111111")
    argv = ["--wheel", str(wheel), "--tiers", "dispatch", "--", "-k", "legacy"]
    own, _ = gate.split_pytest_args(argv)
    cmd = gate.nox_command(gate.parser().parse_args(own), argv)
    assert cmd[1:] == [
        "-f", str(gate.ROOT / "noxfile.py"), "-s", "gate", "--", f"--vllm={wheel}", "--tiers", "dispatch", "--", "-k",
        "legacy",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--vllm-python", "/nonexistent/bin/python"], "--vllm-python /nonexistent/bin/python: no such interpreter"),
        (["--vllm", "latest"], "--vllm 'latest': not a release version (e.g. 0.33.0)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, says):
    assert gate.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"moegate gate: {says}"


def test_tiers_default_to_dispatch_and_kernels_on_a_gpu_and_refuse_an_unknown_one():
    assert gate.parse_tiers(None, cuda=True) == ["dispatch", "kernels"]
    assert gate.parse_tiers(None, cuda=False) == ["dispatch"]
    assert gate.parse_tiers("sweep, dispatch", cuda=True) == ["dispatch", "sweep"]
    with pytest.raises(gate.GateInputError, match="unknown tier 'bench'"):
        gate.parse_tiers("dispatch,bench", cuda=True)


def _junit(tmp_path: Path, cases: list[tuple[str, str | None]]) -> Path:
    body = "".join(
        f'<testcase classname="{cls}" name="t{i}">'
        + (f"<{kind} message='no CUDA GPU'/>" if kind else "")
        + "</testcase>"
        for i, (cls, kind) in enumerate(cases)
    )
    path = tmp_path / "r.xml"
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


def test_the_kernel_floor_counts_executed_kernel_tests_and_quotes_the_first_skip(tmp_path):
    k = "tests.kernels.test_kernel_properties"
    mixed = _junit(tmp_path, [(k, None), (k, "failure"), (k, "skipped"), (k, "error"), ("tests.dispatch.x", None)])
    assert gate.kernel_floor(mixed, 2) == (
        "kernel floor", True, "2 kernel tests executed, at least 2 required: 4 collected, 1 skipped, 1 errors, 1 failed"
    )  # fmt: skip
    skipped = _junit(tmp_path, [(k, "skipped")] * 47 + [("tests.dispatch.b", None)] * 22)
    _, ok, why = gate.kernel_floor(skipped, 40)
    assert not ok and why.startswith("0 kernel tests executed, at least 40 required: 47 collected, 47 skipped")
    assert why.endswith("; first skip: no CUDA GPU")
    assert gate.kernel_floor(tmp_path / "none.xml", 1)[1] is False


def _gpu_build(tmp_path: Path, name: str, cuda: bool, vllm: str = "import torch\n__version__ = '0.33.0'\n") -> Path:
    """A build whose stand-in torch sees a CUDA GPU or not, and whose stand-in vLLM runs ``vllm``."""
    site = tmp_path / f"{name}-site"
    torch = (
        f"__version__ = '2.11.0'\n\nclass cuda:\n    @staticmethod\n    def is_available():\n        return {cuda}\n"
    )
    for package, init in (("torch", torch), ("vllm", vllm)):
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text(init)
    return make_build(tmp_path / name, sys.executable, sites=[str(site)])


def test_the_diff_tier_needs_a_base_it_can_run_and_says_so_in_one_line_before_any_tier(tmp_path, capsys):
    pr = _gpu_build(tmp_path, "pr", cuda=True)
    assert gate.main(["--vllm-python", str(pr), "--tiers", "diff"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "moegate gate: tier diff compares this build with the PR's base: give the base as --base-python PATH"
    ]
    cpu_base = _gpu_build(tmp_path, "cpu-base", cuda=False)
    assert gate.main(["--vllm-python", str(pr), "--tiers", "diff", "--base-python", str(cpu_base)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"moegate gate: tier diff needs a CUDA GPU, and torch in the base build {cpu_base} sees none"
    ]
    broken = _gpu_build(tmp_path, "broken-base", cuda=True, vllm="raise ImportError('no _C')\n")
    assert gate.main(["--vllm-python", str(pr), "--tiers", "diff", "--base-python", str(broken)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"moegate gate: --base-python {broken}: vLLM does not import there (ImportError: no _C)")


def test_a_tier_that_exits_2_is_read_as_a_failure_and_is_no_pass():
    from moegate.core.faults import FAIL, Attempt, classify

    assert classify(Attempt(2, (), "moegate diff: not judged: base and PR run different GPUs", ())).verdict == FAIL
    assert gate.parse_tiers(None, cuda=True, base=True) == ["dispatch", "kernels", "diff"]
    assert gate.parse_tiers(None, cuda=False, base=True) == ["dispatch"]


def test_a_passing_tier_says_how_it_ran_and_the_diff_tier_is_no_pytest_run() -> None:
    from moegate.cli.gate_page import TierRun
    from moegate.core.faults import PASS, Outcome

    pytest_tier = TierRun("dispatch + kernels", [Outcome(PASS, "")], ["py", "-m", "pytest", "tests/dispatch"])
    diff_tier = TierRun("diff", [Outcome(PASS, "")], ["py", "-m", "moegate", "diff", "--base-python=b"])
    assert (gate._why(pytest_tier), gate._why(diff_tier)) == ("pytest exit 0", "exit 0")
