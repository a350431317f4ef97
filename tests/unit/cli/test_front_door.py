"""The front door: ``moegate --help`` names every subcommand, each one runs its tier's own ``main``, an unknown one
is one line; the ``python -m`` command lines the workflows and scripts call are the subcommands' aliases."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib

import pytest

from moegate import cli
from tests.support import ROOT


def test_the_console_script_is_the_front_door():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"moegate": "moegate.cli:main"}


ENTRY_POINTS = {
    "moegate/__main__.py": "door: python -m moegate, the front door's alias",
    "moegate/ab/__main__.py": "door: moegate ab's alias, which nox's A/B sessions run in the driver's environment",
    "moegate/e2e/__main__.py": "door: moegate e2e's alias, which nox's e2e sessions and the GPU leg run",
    "moegate/power/__main__.py": "door: moegate power's alias, which nox -s power runs in the mutation tool's environment",
    "moegate/census/__main__.py": "door: moegate census's alias, which nox -s bless -- census runs in a build's Python",
    "moegate/builds/planted/__main__.py": "door: moegate make-build's alias, which the lab's GPU scripts make builds with",
    "moegate/reach/__main__.py": "door: moegate reach's alias, which nox -s reach and lab/gpu/reach.sh run in a build",
    "moegate/census/fit.py": "door: nox -s fit and the nightly against vLLM main (tooling/ci/vllm_main.py) run it",
    "moegate/kernels/sweep.py": "worker: moegate gate runs the sweep in the build's Python",
    "moegate/builds/bench_serve.py": "worker: the A/B keeps one running in each build",
    "moegate/model/engine.py": "worker: each engine scenario in a process of its own (tests/kernels)",
    "moegate/model/tiny_model.py": "worker: nox writes the tiny model in vLLM's Python (moegate tiny-model too)",
    "moegate/model/quantize.py": "worker: the lab's e2e plan writes pre-quantized checkpoints in the driver's Python",
    "moegate/offload/engine.py": "worker: the offload-truth plan starts one per run",
    "moegate/builds/devsite.py": "worker: the lab's rehearsal makes a dev-versioned site in a build's Python",
    "moegate/e2e/lmeval/launcher.py": "worker: run by path in lm-eval's own environment",
}
"""Every module a ``python -m`` (or a path) runs: a user's door or a worker process something spawns. Anything else
a user runs is a subcommand of ``moegate``; anything else a maintainer runs, one of ``cli.MAINTAINERS``."""


def _runnable(path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return path.name == "__main__.py" or any(
        isinstance(n, ast.If) and ast.unparse(n.test) in ("__name__ == '__main__'", "'__main__' == __name__")
        for n in tree.body
    )


def test_every_module_that_runs_as_a_program_is_a_door_or_a_worker():
    runnable = {p.relative_to(ROOT).as_posix() for p in (ROOT / "moegate").rglob("*.py") if _runnable(p)}
    assert runnable == set(ENTRY_POINTS), (
        f"a program that is no door nor a spawned worker: {sorted(runnable - set(ENTRY_POINTS))} "
        f"(make it a subcommand of moegate/cli/__init__.py); listed but no program: {sorted(set(ENTRY_POINTS) - runnable)}"
    )


def test_every_subcommand_and_maintainers_command_names_a_module_with_a_main():
    for name, (module, _) in {**cli.COMMANDS, **cli.MAINTAINERS}.items():
        path = ROOT / (module.replace(".", "/") + ".py")
        path = path if path.is_file() else path.with_suffix("") / "__init__.py"
        mains = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        assert mains, f"moegate {name}: {module} has no main(argv)"


def test_help_lists_every_subcommand_and_each_names_a_main(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert f"\n  {name} " in out
    users, maintainers = out.split("\nmoegate's own measurements")
    assert all(f"\n  {name} " in maintainers and f"\n  {name} " not in users for name in cli.MAINTAINERS)
    assert list(cli.COMMANDS)[:6] == ["gate", "e2e", "ab", "sweep", "preflight", "fetch-gsm8k"]  # the order users meet


@pytest.mark.parametrize(
    "name",
    ["gate", "e2e", "ab", "preflight", "fetch-gsm8k", "repro", "spec", "power", "offload-truth", "make-build", "gsm8k"]
    + ["tiny-model", "ab-spread", "ab-simulate", "train-tiny", "text-routing"],
)
def test_each_subcommand_hands_its_arguments_to_its_own_main(name, capsys):
    """``moegate NAME --help`` is the tier's own parser: the subcommand adds nothing and drops nothing."""
    with pytest.raises(SystemExit) as done:
        cli.main([name, "--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_an_unknown_subcommand_or_none_is_one_line_or_the_usage(capsys):
    assert cli.main(["bench"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"moegate: unknown command 'bench'; known: {', '.join(cli.COMMANDS)} (moegate --help)"
    )
    assert cli.main([]) == 2 and capsys.readouterr().out.startswith("usage: moegate COMMAND")


def test_a_subcommand_whose_extra_is_not_installed_is_one_line_naming_the_extra(monkeypatch, capsys):
    """A bare ``pip install moegate`` has no numpy: ``moegate e2e`` said so in a traceback before (2026-12-02)."""

    def missing(name: str):
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")

    monkeypatch.setattr(cli, "entry", missing)
    assert cli.main(["e2e", "run"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "moegate e2e: needs the package 'numpy', not installed in this Python (pip install 'moegate[e2e]')"
    ]

    def broken(name: str):
        raise ModuleNotFoundError("No module named 'moegate.e2e.gone'", name="moegate.e2e.gone")

    monkeypatch.setattr(cli, "entry", broken)
    with pytest.raises(ModuleNotFoundError):  # moegate's own module missing is not an extra to install
        cli.main(["e2e", "run"])


def test_python_dash_m_moegate_is_the_same_door():
    proc = subprocess.run(
        [sys.executable, "-m", "moegate", "spec", '{"num_tokens": 1, "top_k": 1, "num_experts": 8}'],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.splitlines()[0].startswith("legacy: naive")


def test_moegate_census_hands_its_arguments_to_the_census(tmp_path, capsys):
    # a folder that is not vLLM: the census's own one-line refusal, through the front door
    assert cli.main(["census", "--vllm-root", str(tmp_path), "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"census: {tmp_path} is not a vLLM package: looked for {tmp_path}/__init__.py"]


def test_a_reader_that_stops_early_gets_no_traceback():
    """``moegate --help | head -1``: the pipe closes before the usage is written; that is not the command's error."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "moegate", "--help"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # no reader left: the usage's write meets a broken pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1 and "Traceback" not in err and "BrokenPipeError" not in err


def test_offload_truth_is_a_subcommand_that_refuses_an_unknown_run_in_one_line(tmp_path, capsys):
    """Offload truth was reachable only through a GPU-machine shell script (issue 46); now ``moegate offload-truth``."""
    assert cli.main(["offload-truth", "--python", sys.executable, "--out", str(tmp_path), "--only", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown run(s) ['nope']" in err[0]
    assert not any(tmp_path.iterdir())  # nothing written
