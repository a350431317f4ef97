"""The front door: ``moegate --help`` names every subcommand, each one runs its tier's own ``main``, an unknown one
is one line; the ``python -m`` command lines the workflows and scripts call are the subcommands' aliases."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from moegate import cli
from tests.support import ROOT


def test_the_console_script_is_the_front_door():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"moegate": "moegate.cli:main"}


def test_help_lists_every_subcommand_and_each_names_a_main(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert f"\n  {name} " in out
    assert list(cli.COMMANDS)[:6] == ["gate", "e2e", "ab", "sweep", "preflight", "fetch-gsm8k"]  # the order users meet


@pytest.mark.parametrize(
    "name", ["gate", "e2e", "ab", "preflight", "fetch-gsm8k", "repro", "spec", "power", "offload-truth"]
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
