"""The compiled-binaries steps of the example caller's wheels job, of its MoE compiler cache and of moegate.yml's
dispatch job (issue 44 items 1-2): their order read from the YAML, and each step's own ``run:`` script executed here
with bash, as a runner would, over small real vLLM-shaped git repositories and wheels (``tests.support.vllm_tree``),
with ``$GITHUB_OUTPUT``, ``$GITHUB_ENV`` and ``$GITHUB_STEP_SUMMARY`` as files. Only ``docker`` (``.ci/rebuild-moe``)
is a stand-in that records its arguments: the image's build is the device rehearsal's (lab/gpu/compiled.sh)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT
from tests.support.vllm_tree import branch, commit, make_repo

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed here (the unit env has it: nox -s unit)")

MOE = "_moe_C_stable_libtorch"
LINE = "compiled MoE sources changed (csrc/moe/moe_align_sum_kernels.cu): this runner cannot build them"


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


CALLER = _load(ROOT / "examples" / "vllm-caller.yml")
CACHE = _load(ROOT / "examples" / "vllm-moe-cache.yml")
REUSABLE = _load(ROOT / ".github" / "workflows" / "moegate.yml")
WHEELS = CALLER["jobs"]["wheels"]["steps"]


def _step(steps: list[dict[str, Any]], needle: str) -> tuple[int, dict[str, Any]]:
    found = [(i, s) for i, s in enumerate(steps) if needle == s.get("id")]  # a step's id, else a text of its script
    found = found or [(i, s) for i, s in enumerate(steps) if needle in str(s.get("run", ""))]
    assert len(found) == 1, f"{len(found)} steps match {needle!r}"
    return found[0]


def _uses(steps, prefix):
    return [i for i, s in enumerate(steps) if str(s.get("uses", "")).startswith(prefix)]


def test_the_wheels_job_pins_first_then_checks_then_builds_then_rebuilds_then_hashes_then_uploads():
    pin, _ = _step(WHEELS, "moegate builds pin")
    changes, _ = _step(WHEELS, "moegate builds changes")
    _, wheel_step = _step(WHEELS, "pip wheel")
    build = WHEELS.index(wheel_step)
    rebuild, rebuild_step = _step(WHEELS, ".ci/rebuild-moe")
    hashes, _ = _step(WHEELS, "moegate builds compare")
    upload = _uses(WHEELS, "actions/upload-artifact@")
    assert pin < changes < build < rebuild < hashes < upload[0]
    assert wheel_step["env"]["VLLM_USE_PRECOMPILED"] == "1"  # over the binaries the pin named (its $GITHUB_ENV)
    assert rebuild_step["if"] == "steps.changes.outputs.rebuild == 'true'"
    assert WHEELS[upload[0]]["with"]["path"] == "${{ runner.temp }}/wheels/"  # compiled/ goes with the wheels


def test_a_prs_run_only_reads_the_compiler_cache_and_only_mains_run_writes_it():
    restore = _uses(WHEELS, "actions/cache/restore@")
    assert len(restore) == 1 and WHEELS[restore[0]]["if"] == "steps.changes.outputs.rebuild == 'true'"
    for job in CALLER["jobs"].values():
        assert not [s for s in job.get("steps", []) if "actions/cache@" in str(s.get("uses", ""))
                    or "actions/cache/save@" in str(s.get("uses", ""))]  # fmt: skip
    keys: dict[Any, Any] = {**CACHE}  # YAML reads the key `on` as True
    on: Any = keys.get("on", keys.get(True))
    assert list(on) == ["push"] and on["push"]["branches"] == ["main"]
    steps = CACHE["jobs"]["moe-cache"]["steps"]
    save = _uses(steps, "actions/cache/save@")
    assert len(save) == 1 and steps[save[0]]["if"] == "github.ref == 'refs/heads/main'"
    key = WHEELS[restore[0]]["with"]["restore-keys"]
    assert steps[save[0]]["with"]["key"].startswith(key)  # what main saves, a PR's restore finds


def test_moegate_yml_holds_the_builds_extensions_to_the_changes_in_the_dispatch_job_before_its_report():
    steps = REUSABLE["jobs"]["dispatch"]["steps"]
    i, step = _step(steps, "moegate builds compare")
    assert step["if"] == "${{ !cancelled() && inputs.wheels-artifact != '' }}"
    assert '--changes "$wheels/compiled/changes.json"' in step["run"] and "--md reports/extensions.md" in step["run"]
    report = [k for k, s in enumerate(steps) if str(s.get("run", "")).strip() == ".ci/report"]
    assert report and i < report[0]  # .ci/report puts reports/*.md into the job summary


# --- the steps' scripts, run -------------------------------------------------------------------------------------


@pytest.fixture
def runner(tmp_path):
    """A runner's workspace: the PR's vLLM checkout in vllm/ (the merge base and the PR branch), moegate in moegate/."""
    ws = tmp_path / "ws"
    vllm, base = make_repo(ws / "vllm")
    branch(vllm, "pr", base)
    (ws / "moegate").symlink_to(ROOT)
    temp = tmp_path / "temp"
    temp.mkdir()
    files = {n: tmp_path / n for n in ("gh_output", "gh_env", "summary")}
    for f in files.values():
        f.write_text("")
    env = dict(os.environ, GITHUB_WORKSPACE=str(ws), RUNNER_TEMP=str(temp), GITHUB_OUTPUT=str(files["gh_output"]),
               GITHUB_ENV=str(files["gh_env"]), GITHUB_STEP_SUMMARY=str(files["summary"]),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # fmt: skip
    return {"ws": ws, "vllm": vllm, "base": base, "temp": temp, "env": env, **files}


def run_step(steps, needle, runner, **env) -> subprocess.CompletedProcess[str]:
    _, step = _step(steps, needle)
    cwd = runner["ws"] / step.get("working-directory", ".")
    return subprocess.run(["bash", "-e", "-c", step["run"]], cwd=cwd, env={**runner["env"], **env},
                          capture_output=True, text=True, check=False)  # fmt: skip


def test_the_pin_step_writes_the_named_wheel_into_the_jobs_env(runner, tmp_path):
    index = tmp_path / "index"
    meta = index / runner["base"] / "cu130" / "vllm" / "metadata.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps([{"package_name": "vllm", "platform_tag": "manylinux1_x86_64", "path": "../v.whl"}]))
    head = commit(runner["vllm"], {"docs/index.md": "# docs\n"})
    out = run_step(WHEELS, "pin", runner, BASE_SHA=runner["base"], PRECOMPILED_VARIANT="cu130",
                   MOEGATE_PRECOMPILED_INDEX=index.as_uri())  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert runner["gh_output"].read_text() == f"merge-base={runner['base']}\n"
    assert (
        f"VLLM_PRECOMPILED_WHEEL_LOCATION={index.as_uri()}/{runner['base']}/cu130/v.whl\n"
        in runner["gh_env"].read_text()
    )
    assert head  # the PR's head was checked out: the merge base is found from it
    missing = run_step(WHEELS, "pin", runner, BASE_SHA=head, PRECOMPILED_VARIANT="cu130",
                       MOEGATE_PRECOMPILED_INDEX=(tmp_path / "empty").as_uri())  # fmt: skip
    assert missing.returncode == 1 and missing.stderr.startswith("precompiled build cannot be pinned: ")


@pytest.mark.parametrize(
    ("change", "rebuild", "status", "output"),
    [
        ({"csrc/moe/moe_align_sum_kernels.cu": "// bug\n"}, "false", 1, ""),
        ({"csrc/moe/moe_align_sum_kernels.cu": "// bug\n"}, "true", 0, "rebuild=true\n"),
        ({"csrc/attention/paged.cu": "// faster\n"}, "false", 0, "rebuild=false\n"),
    ],
)
def test_the_changes_step_fails_in_the_one_line_or_asks_for_the_rebuild(runner, change, rebuild, status, output):
    commit(runner["vllm"], change)
    out = run_step(WHEELS, "changes", runner, MERGE_BASE=runner["base"], REBUILD_MOE=rebuild)
    assert out.returncode == status, out.stderr
    assert runner["gh_output"].read_text() == output
    if status:
        assert out.stdout.splitlines()[-1] == f"::error::{LINE}"
    record = json.loads((runner["temp"] / "wheels" / "compiled" / "changes.json").read_text())
    assert record["base"] == runner["base"] and record["changed"] == list(change)


def _wheel(path: Path, moe: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr(f"vllm/{MOE}.abi3.so", moe)
    return path


@pytest.mark.parametrize(("change", "pr_moe", "status"), [
    ({"docs/index.md": "# docs\n"}, b"moe", 0),
    ({"docs/index.md": "# docs\n"}, b"moe from another build", 1),
    ({"csrc/moe/moe_align_sum_kernels.cu": "// fix\n"}, b"moe", 1),
    ({"csrc/moe/moe_align_sum_kernels.cu": "// fix\n"}, b"moe, rebuilt", 0),
])  # fmt: skip
def test_the_hash_steps_of_the_caller_and_of_moegate_yml_hold_the_builds_to_what_changed(
    runner, change, pr_moe, status
):
    commit(runner["vllm"], change)
    wheels = runner["temp"] / "wheels"
    run_step(WHEELS, "changes", runner, MERGE_BASE=runner["base"], REBUILD_MOE="true")
    _wheel(wheels / "base" / "vllm-1-cp38-abi3-linux_x86_64.whl", b"moe")
    _wheel(wheels / "pr" / "vllm-2-cp38-abi3-linux_x86_64.whl", pr_moe)
    out = run_step(WHEELS, "moegate builds compare", runner)
    assert out.returncode == status, out.stderr
    summary = runner["summary"].read_text()
    assert summary.startswith("### Compiled extensions (moegate builds compare)")
    assert f"| `vllm/{MOE}.abi3.so` |" in summary
    # the reusable gate's dispatch job, from the downloaded artifact, on its own checkout
    dl = runner["temp"] / "moegate-wheels"
    os.rename(wheels, dl)
    (runner["ws"] / "reports").mkdir()
    (runner["ws"] / "tooling").symlink_to(ROOT / "tooling")
    gate = run_step(REUSABLE["jobs"]["dispatch"]["steps"], "moegate builds compare", runner,
                    BASE="base/*.whl", PR="pr/*.whl", PYTHONPATH=str(ROOT))  # fmt: skip
    assert gate.returncode == status, gate.stderr
    verdict = json.loads((runner["ws"] / "reports" / "extensions.json").read_text())["verdict"]
    assert verdict.startswith("PASS" if status == 0 else "FAIL")
    assert (runner["ws"] / "reports" / "extensions.md").read_text().splitlines()[2] == f"**{verdict}**"


# --- .ci/rebuild-moe, with docker as a stand-in ---------------------------------------------------------------------

DOCKER = """#!/bin/sh
printf '%s\\0' "$@" > "$DOCKER_LOG"
"""


def test_rebuild_moe_runs_the_build_in_the_cuda_image_with_vllms_own_pins(runner, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(DOCKER)
    (bin_dir / "docker").chmod(0o755)
    wheel = _wheel(tmp_path / "pr" / "vllm-2-cp38-abi3-linux_x86_64.whl", b"moe")
    cmake = (runner["vllm"] / "CMakeLists.txt").read_text().replace("include(FetchContent)",
                                                                       'include(FetchContent)\nset(CUTLASS_REVISION "v4.7.1")')  # fmt: skip
    commit(runner["vllm"], {"CMakeLists.txt": cmake})
    env = {**runner["env"], "PATH": f"{bin_dir}:{runner['env']['PATH']}", "DOCKER_LOG": str(tmp_path / "docker.log")}
    out = subprocess.run([str(ROOT / ".ci" / "rebuild-moe"), str(runner["vllm"]), str(wheel), str(tmp_path / "out"), "8.9"],
                         env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    args = (tmp_path / "docker.log").read_text().split("\0")[:-1]
    assert args[:2] == ["run", "--rm"] and "nvidia/cuda:13.0.0-devel-ubuntu22.04" in args
    assert {"TORCH_PIN=torch==2.14.0", "CUTLASS_REV=v4.7.1", "ARCH=8.9", "CCACHE_DIR=/ccache",
            f"INTO=--into /in/{wheel.name} --out /out"} <= set(args)  # fmt: skip
    assert f"{runner['temp'] / 'moe-ccache'}:/ccache" in args and f"{wheel.parent}:/in:ro" in args
    script = args[-1]
    assert 'python -m moegate builds rebuild-moe --vllm-src /src --arch "$ARCH"' in script
    assert "--launcher ccache" in script


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "usage: .ci/rebuild-moe VLLM_SRC WHEEL|- OUT_DIR ARCH"),
        (["{tmp}", "-", "{tmp}/out", "8.9"], "has no CMakeLists.txt: not a vLLM tree"),
        (["{vllm}", "{tmp}/none.whl", "{tmp}/out", "8.9"], "none.whl: no such wheel"),
        (["{vllm}", "-", "{tmp}/out", "sm_89"], "ARCH 'sm_89' is not like 8.9"),
        (["{vllm}", "-", "{tmp}/out", "8.9"], "sets no CUTLASS_REVISION"),
    ],
)
def test_rebuild_moe_refuses_bad_input_in_one_line(runner, tmp_path, args, says):
    argv = [a.format(tmp=tmp_path, vllm=runner["vllm"]) for a in args]
    out = subprocess.run([str(ROOT / ".ci" / "rebuild-moe"), *argv], env=runner["env"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and says in out.stderr, out.stderr
