"""The CI helpers: the input check of the reusable gate, the @example line (the executed-test floor: tests/unit/cli)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given

from moegate.core.case import MoECase
from moegate.core.check import EXAMPLE_PREFIX, DispatchMismatch, assert_path, example_line
from moegate.strategies import moe_cases
from tests.support import ROOT
from tooling.ci import gate_plan

# --- gate_plan --------------------------------------------------------------------------


def test_unknown_tier_is_one_line_before_anything_else():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tooling.ci.gate_plan",
            "plan",
            "--tiers",
            "dispatch,kernals",
            "--base",
            "0.32.0",
            "--pr",
            "0.33.0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "moegate: unknown tier 'kernals' in tiers='dispatch,kernals'; known: dispatch, meta, kernels, e2e, ab"
    )


def test_an_unknown_model_is_one_line_before_anything_else():
    """A bare word that is neither a named model nor a folder's path is a typo: refused by the shared vocabulary
    (moegate/core/tiers.py, which the Buildkite steps' gate uses too) before any leg is planned."""
    cmd = [sys.executable, "-m", "tooling.ci.gate_plan", "plan", "--tiers", "e2e", "--base", "0.32.0", "--pr", "0.33.0"]
    proc = subprocess.run([*cmd, "--models", "random,trianed"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == (
        "moegate: unknown model 'trianed' in models='random,trianed'; known: random, trained, or a folder's path "
        "(with a /: ./trianed)"
    )
    folder = subprocess.run([*cmd, "--models", "./trianed"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert folder.returncode == 0, folder.stderr


@pytest.mark.parametrize(
    ("spec", "kind", "arg"),
    [
        ("0.33.0", "version", "--vllm=0.33.0"),
        ("0.10.1.1", "version", "--vllm=0.10.1.1"),
        (
            "dist/vllm-0.34.0.dev1-cp38-abi3-linux_x86_64.whl",
            "wheel",
            "--vllm=dist/vllm-0.34.0.dev1-cp38-abi3-linux_x86_64.whl",
        ),
        ("https://example.org/vllm-0.33.0-cp38-abi3-linux_x86_64.whl", "wheel-url", None),
        ("/opt/envs/vllm/bin/python", "python", "--vllm-python=/opt/envs/vllm/bin/python"),
        ("/opt/envs/vllm/bin/python3.11", "python", None),
    ],
)
def test_build_specs(spec, kind, arg):
    assert gate_plan.classify("pr", spec) == kind
    if arg:
        assert gate_plan.nox_arg(spec) == arg


@pytest.mark.parametrize("spec", ["", "latest", "main", "bin/python", "0.33.0; rm -rf /", "vllm==0.33.0"])
def test_a_non_build_is_refused(spec):
    with pytest.raises(gate_plan.PlanError, match="is not a build"):
        gate_plan.classify("pr", spec)


def _fake_pypi(url, method="GET"):
    if "pypi.org/pypi/vllm/json" in url:
        return 200, json.dumps({"releases": {"0.32.0": [], "0.33.0": [], "0.9.2": []}}).encode()
    return (404, b"") if "missing" in url else (200, b"")


def test_remote_checks_name_what_does_not_exist():
    gate_plan.check_remote("pr", "0.33.0", fetch=_fake_pypi)
    with pytest.raises(
        gate_plan.PlanError,
        match=r"pr='0.99.0': vLLM 0.99.0 is not a release on PyPI \(newest: 0.9.2, 0.32.0, 0.33.0\)",
    ):
        gate_plan.check_remote("pr", "0.99.0", fetch=_fake_pypi)
    with pytest.raises(gate_plan.PlanError, match="the wheel URL answered HTTP 404"):
        gate_plan.check_remote("base", "https://example.org/missing/vllm.whl", fetch=_fake_pypi)


def test_local_builds_are_found_on_the_runner(tmp_path):
    assert gate_plan.local_spec("pr", sys.executable) == sys.executable
    assert gate_plan.local_spec("pr", "0.33.0", str(tmp_path)) == "0.33.0"
    with pytest.raises(gate_plan.PlanError, match="no such wheel on this runner"):
        gate_plan.local_spec("pr", str(tmp_path / "vllm.whl"))
    with pytest.raises(gate_plan.PlanError, match="no such python interpreter"):
        gate_plan.local_spec("base", "/nonexistent/bin/python")
    (tmp_path / "pr").mkdir()
    wheel = tmp_path / "pr" / "vllm-0.34.0.dev3+g1234-cp38-abi3-linux_x86_64.whl"
    wheel.write_bytes(b"")
    assert gate_plan.local_spec("pr", "pr/*.whl", str(tmp_path)) == str(wheel)
    (tmp_path / "pr" / "vllm-0.34.0.dev4-cp38-abi3-linux_x86_64.whl").write_bytes(b"")
    with pytest.raises(gate_plan.PlanError, match=r"2 wheels match .* in "):
        gate_plan.local_spec("pr", "pr/*.whl", str(tmp_path))


def test_plan_fans_gpu_tiers_out_per_model_and_pair():
    out = gate_plan.plan("dispatch,kernels,e2e,ab", "0.32.0", "0.33.0", "trained, /data/qwen3-30b-a3b")
    legs = json.loads(out["gpu-matrix"])["include"]
    assert [(leg["leg"], leg["model"]) for leg in legs] == [
        ("kernels-pr", "-"),
        ("e2e-trained-base-vs-pr", "trained"),
        ("e2e-_data_qwen3-30b-a3b-base-vs-pr", "/data/qwen3-30b-a3b"),
        ("ab-base-vs-pr", "trained"),
    ]
    default = json.loads(gate_plan.plan("e2e,ab", "0.32.0", "0.33.0")["gpu-matrix"])["include"]
    assert [leg["leg"] for leg in default] == ["e2e-random-base-vs-pr", "e2e-trained-base-vs-pr", "ab-base-vs-pr"]
    assert out["run-dispatch"] == "true" and out["run-meta"] == "false" and out["run-gpu"] == "true"
    assert gate_plan.plan("dispatch", "0.32.0", "0.33.0")["gpu-matrix"] == '{"include":[]}'


def test_the_old_name_of_the_ab_tier_says_its_new_one():
    with pytest.raises(gate_plan.PlanError, match="tier 'bench' is now 'ab' .*nox -s bench is the dispatch benchmark"):
        gate_plan.plan("dispatch,bench", "0.32.0", "0.33.0")


def test_meta_needs_the_known_bad_base():
    with pytest.raises(gate_plan.PlanError, match="tier 'meta' demands the base fail"):
        gate_plan.plan("meta", "0.31.0", "0.33.0")
    assert gate_plan.plan("meta", "/opt/base/bin/python", "0.33.0")["run-meta"] == "true"


# --- the @example line a nightly failure prints ------------------------------------------


@given(case=moe_cases())
def test_example_line_pastes_back_to_the_same_case(case):
    line = example_line(case)
    assert line.startswith(EXAMPLE_PREFIX + "@example(case=MoECase.from_dict(") and "\n" not in line
    decorator = eval(line.removeprefix(EXAMPLE_PREFIX)[1:], {"example": example, "MoECase": MoECase})
    assert decorator._this_example.kwargs["case"] == case  # what hypothesis.example recorded


@pytest.mark.parametrize("dev", ["1", None], ids=["moegate's own run", "a vLLM developer's run"])
def test_a_mismatch_message_carries_the_example_line_in_moegates_own_runs_only(monkeypatch, dev):
    """MOEGATE_DEV (the noxfile's test sessions set it): the @example line is for moegate's own strategies."""
    if dev is None:
        monkeypatch.delenv("MOEGATE_DEV", raising=False)
    else:
        monkeypatch.setenv("MOEGATE_DEV", dev)
    case = MoECase(num_tokens=1, top_k=1, num_experts=8)

    class WrongPath:
        def run(self, case, entrypoint):
            return type("Obs", (), {"path": "sorted"})()

    with pytest.raises(DispatchMismatch) as err:
        assert_path(WrongPath(), case, "legacy")
    lines = str(err.value).splitlines()
    assert lines[1] == f"  reproduce: python -m moegate repro '{case.to_json()}'"
    assert (example_line(case) in lines[2]) is (dev is not None)
    assert ("pin it:" in str(err.value)) is (dev is not None) and lines[-1].startswith("MOEGATE-MISMATCH {")


# --- .ci/gsm8k: the hosted jobs' GSM8K download, checked before any test reads it -------


def _fetch_gsm8k(tmp_path: Path, source: Path) -> subprocess.CompletedProcess[str]:
    """.ci/gsm8k as a job runs it, its source a local folder (``MOEGATE_GSM8K_SOURCE``, as ci-replay gives it)."""
    (tmp_path / "runner").mkdir()
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "RUNNER_TEMP": str(tmp_path / "runner"),
        "GITHUB_ENV": str(tmp_path / "github_env"),
        "MOEGATE_GSM8K_SOURCE": source.as_uri(),
    }
    (tmp_path / "github_env").write_text("")
    return subprocess.run(
        [str(ROOT / ".ci" / "gsm8k")], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_gsm8k_download_that_is_not_the_published_file_fails_the_step_and_exports_nothing(tmp_path):
    changed = tmp_path / "changed"
    changed.mkdir()
    for name in ("test.jsonl", "train.jsonl"):
        (changed / name).write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    proc = _fetch_gsm8k(tmp_path, changed)
    assert proc.returncode == 1
    assert "not the published file" in proc.stderr.strip().splitlines()[-1]
    assert (tmp_path / "github_env").read_text() == ""


def test_the_published_gsm8k_files_are_exported_to_the_later_steps(tmp_path):
    from moegate.e2e.gsm8k_files import DataError, gsm8k_file

    try:
        source = gsm8k_file("train.jsonl").parent
    except DataError as exc:
        pytest.skip(f"GSM8K is not beside the checkout: {exc}")
    proc = _fetch_gsm8k(tmp_path, source)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "github_env").read_text() == f"MOEGATE_GSM8K_DIR={tmp_path / 'runner' / 'gsm8k'}\n"


def test_each_gpu_leg_says_what_it_runs_with_for_the_verdict_to_read():
    out = gate_plan.plan("dispatch,kernels,e2e,ab", "0.32.0", "0.33.0", "random", promise="equivalent",
                         ab_gate=False, min_kernel_tests=60)  # fmt: skip
    says = {leg["leg"]: leg["says"] for leg in json.loads(out["gpu-matrix"])["include"]}
    assert says == {"kernels-pr": "at least 60 kernel tests", "e2e-random-base-vs-pr": "promise equivalent",
                    "ab-base-vs-pr": "advisory"}  # fmt: skip
    gating = json.loads(gate_plan.plan("ab", "0.32.0", "0.33.0", ab_gate_threshold=0.05)["gpu-matrix"])["include"]
    assert gating[0]["says"] == "gating at 0.05"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--promise", "maybe"], "moegate: promise='maybe' is no promise; choose identical or equivalent"),
        (["--gpu-runner-label", ""], "moegate: gpu-runner-label='' is not a runner label"),
        (["--gpu-runner-label", "gpu, ubuntu-24.04"], "gpu-runner-label='gpu, ubuntu-24.04' is not a runner label"),
    ],
)
def test_a_bad_promise_or_runner_label_is_one_line(args, says):
    proc = subprocess.run(
        [sys.executable, "-m", "tooling.ci.gate_plan", "plan", "--tiers", "dispatch", "--base", "0.32.0", "--pr",
         "0.33.0", *args], cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith(says) or says in proc.stderr, proc.stderr


def test_another_pools_label_is_accepted():
    assert gate_plan.gpu_runner_label("h100-80gb") == "h100-80gb"
