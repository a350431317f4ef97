"""The Buildkite test area (``moegate buildkite``, examples/buildkite-moegate.yaml): parsed, its steps run.

Each step's commands run as a Buildkite agent runs them: ``$$`` made ``$``, one ``sh -e`` script after a ``cd`` to the
working directory, the step's ``env`` set. Real git clones a stand-in moegate repository at the pinned ref, and the
real front door (``moegate gate``, from this checkout) gates a stand-in of the heavy part: the image's ``python3``,
which answers the gate's import probe, records pip and pytest and writes the JUnit report a tier's pytest run would.
``buildkite-agent`` records its uploads. So the plumbing is what is tested: the commands, the env, the gate's
tiers, its refusal of an unknown tier, its status and the upload of its reports.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moegate.census.watch import golden_paths
from moegate.cli import buildkite
from tests.support import ROOT

EXAMPLE = ROOT / "examples" / "buildkite-moegate.yaml"
ARGS = ["--moegate-repo", "https://github.com/your-org/moegate.git"]
ARGS += ["--moegate-ref", "0123456789abcdef0123456789abcdef01234567"]

FAKE_PYTHON = """#!{python}
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_RECORD"], "a") as fh:
    fh.write(json.dumps(["python3", *argv[:1], *(argv[1:] if argv[:1] != ["-c"] else ["<script>"])]) + "\\n")
if argv[:1] == ["-c"] and "MOEGATE-PROBE" in argv[1]:
    cuda = os.environ.get("FAKE_CUDA") == "1"
    print("MOEGATE-PROBE " + json.dumps({{"python": "3.12", "missing": [], "version": "0.34.0.dev7+gabc", "cuda": cuda}}))
elif argv[:2] == ["-m", "pip"]:
    pass
elif argv[:2] == ["-m", "pytest"]:
    junit = next(a.split("=", 1)[1] for a in argv if a.startswith("--junitxml="))
    cases = [("tests.dispatch.test_dispatch", 3)] + [("tests.kernels.test_kernel_properties", 45)] * ("tests/kernels" in argv)
    rows = "".join(f'<testcase classname="{{c}}" name="t{{i}}"/>' for c, n in cases for i in range(n))
    os.makedirs(os.path.dirname(junit), exist_ok=True)
    with open(junit, "w") as fh:
        fh.write(f"<testsuites><testsuite>{{rows}}</testsuite></testsuites>")
    sys.exit(int(os.environ.get("FAKE_PYTEST_EXIT", "0")))
else:
    sys.exit(3)
"""
"""The image's python3: the vLLM build the step gates, standing in for vLLM and its tiers' pytest run."""

MOEGATE = """#!/bin/sh
MOEGATE_ROOT="$PWD" PYTHONPATH={root} exec {python} -m moegate "$@"
"""
"""The real front door, from this checkout (the pip install it stands for is recorded), reading the clone's data."""

AGENT = """#!/bin/sh
echo "buildkite-agent $* [$(ls reports 2>/dev/null | tr '\\n' ' ')]" >> "$FAKE_RECORD"
"""


def _steps() -> list[dict]:
    data = yaml.safe_load(EXAMPLE.read_text())
    assert data["group"] == "moegate" and data["depends_on"] == ["image-build"]
    return data["steps"]


def _upstream(tmp_path: Path) -> tuple[Path, str]:
    """A stand-in moegate repository: what the step clones (a checkout's tier folders) and the commit it pins."""
    repo = tmp_path / "upstream"
    for tier in ("dispatch", "kernels"):
        (repo / "tests" / tier).mkdir(parents=True)
        (repo / "tests" / tier / "README").write_text(tier)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "stand-in"], check=True)
    subprocess.run(
        [*git, "commit", "--quiet", "--allow-empty", "-m", "a later commit the pin must not take"], check=True
    )
    ref = subprocess.run([*git, "rev-parse", "HEAD~1"], check=True, capture_output=True, text=True).stdout.strip()
    return repo, ref


def run_step(step: dict, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list, Path]:
    """The step as an agent runs it, with the stand-ins; (the run, what the stand-ins recorded, the clone)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in {
        "python3": FAKE_PYTHON.format(python=sys.executable),
        "moegate": MOEGATE.format(root=shlex.quote(str(ROOT)), python=shlex.quote(sys.executable)),
        "buildkite-agent": AGENT,
    }.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    upstream, ref = _upstream(tmp_path)
    clone = tmp_path / "moegate-clone"
    record = tmp_path / "record.jsonl"
    workspace = tmp_path / "vllm-workspace"
    workspace.mkdir()
    script = "\n".join([f"cd {workspace}", *(c.replace("$$", "$") for c in step["commands"])])
    step_env = {**step["env"], "MOEGATE_REPO": str(upstream), "MOEGATE_REF": ref, "MOEGATE_DIR": str(clone)}
    base = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_RECORD": str(record), "LANG": "C.UTF-8"}
    proc = subprocess.run(
        ["sh", "-e", "-c", script], env={**base, **step_env, **env}, capture_output=True, text=True, check=False
    )
    lines = record.read_text().splitlines() if record.exists() else []
    recorded = [json.loads(line) if line.startswith("[") else line for line in lines]
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    assert head.stdout.strip() == ref, "the step did not check out the pinned moegate commit"
    return proc, recorded, clone


def test_the_committed_step_file_is_what_the_generator_prints(capsys):
    assert buildkite.main(ARGS) == 0
    assert capsys.readouterr().out == EXAMPLE.read_text(), f"regenerate: moegate buildkite {' '.join(ARGS)}"


def test_each_step_watches_the_census_paths_and_runs_one_tier_on_its_agent():
    steps = {s["key"]: s for s in _steps()}
    assert sorted(steps) == ["moegate-dispatch", "moegate-kernels"]
    assert (steps["moegate-dispatch"]["device"], steps["moegate-kernels"]["device"]) == ("cpu", "l4")
    # a step's own depends_on wins over the group's: the CPU agent runs vLLM's CPU build of the commit
    assert steps["moegate-dispatch"]["depends_on"] == ["image-build-cpu"]
    assert steps["moegate-kernels"]["depends_on"] == ["image-build"]
    for key, s in steps.items():
        assert s["env"]["MOEGATE_TIERS"] == key.removeprefix("moegate-")
        assert s["source_file_dependencies"] == golden_paths()
        assert "'" not in "".join(s["commands"]), "vLLM's generator turns ' into \" in commands"
    watched = golden_paths()
    assert {"csrc/moe/", "vllm/model_executor/layers/fused_moe/", "vllm/model_executor/models/qwen3_moe.py"} <= set(
        watched
    )


@pytest.mark.parametrize(
    ("key", "cuda", "targets", "beside"),
    [("moegate-dispatch", "0", ["tests/dispatch"], ["triton"]), ("moegate-kernels", "1", ["tests/kernels"], [])],
)
def test_a_step_clones_the_pinned_moegate_gates_the_images_python_and_uploads_the_reports(
    tmp_path, key, cuda, targets, beside
):
    step = next(s for s in _steps() if s["key"] == key)
    proc, recorded, clone = run_step(step, tmp_path, FAKE_CUDA=cuda)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ["python3", "-m", "pip", "install", "--quiet", "-e", str(clone), *beside] in recorded
    pytest_runs = [r for r in recorded if isinstance(r, list) and r[1:3] == ["-m", "pytest"]]
    assert len(pytest_runs) == 1 and [a for a in pytest_runs[0] if a.startswith("tests/")] == targets
    assert f"--junitxml={clone / 'reports' / 'gate.xml'}" in pytest_runs[0]
    assert "moegate gate: PASS: vLLM 0.34.0.dev7+gabc" in proc.stdout
    if key == "moegate-kernels":
        assert "kernel floor ok (45 kernel tests executed, at least 40 required" in proc.stdout
    assert recorded[-1] == "buildkite-agent artifact upload reports/* [gate.md gate.xml ]"  # the page and the JUnit


def test_a_step_given_an_unknown_tier_refuses_it_in_one_line_and_runs_no_tier(tmp_path):
    step = next(s for s in _steps() if s["key"] == "moegate-dispatch")
    proc, recorded, _ = run_step(step, tmp_path, MOEGATE_TIERS="dispatch,kernals")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "moegate gate: unknown tier 'kernals' in --tiers='dispatch,kernals'; known: dispatch, kernels, sweep, diff"
    ]
    assert not [r for r in recorded if isinstance(r, list) and r[1:3] == ["-m", "pytest"]]


def test_a_failing_gate_fails_the_step_and_its_reports_are_still_uploaded(tmp_path):
    step = next(s for s in _steps() if s["key"] == "moegate-dispatch")
    proc, recorded, _ = run_step(step, tmp_path, FAKE_PYTEST_EXIT="1")
    assert proc.returncode == 1
    assert "moegate gate: FAIL: vLLM 0.34.0.dev7+gabc: dispatch FAIL (" in proc.stdout
    assert recorded[-1] == "buildkite-agent artifact upload reports/* [gate.md gate.xml ]"  # the page and the JUnit


@pytest.mark.parametrize(
    ("tiers", "line"),
    [
        ("dispatch,kernals", "moegate buildkite: unknown tier 'kernals' in --tiers='dispatch,kernals'; known: "),
        ("kernels,e2e", "moegate buildkite: tier 'e2e' needs a build beside the PR's (the base)"),
    ],
)
def test_the_generator_refuses_an_unknown_tier_or_one_of_two_builds_in_one_line(capsys, tiers, line):
    assert buildkite.main([*ARGS, "--tiers", tiers]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(line)


def test_the_generator_refuses_a_moegate_ref_that_is_not_a_commit(capsys):
    assert buildkite.main([*ARGS[:2], "--moegate-ref", "main"]) == 2
    assert (
        capsys.readouterr().err
        == "moegate buildkite: --moegate-ref 'main': not a commit SHA (40 hex digits): pin one\n"
    )
