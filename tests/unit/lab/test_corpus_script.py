"""lab/gpu/corpus.sh, the real-bug corpus's device script, run here with a ``python3`` that records its arguments.

The stand-in answers the corpus run as the real one would (a summary page under ``--out``); what is checked is the
command line the device would run (both tiers, the vLLM site, the jobs, the budget it leaves the power re-run), that
the power re-run says why it did not run, and that bad input is one line and exit 2. A typo found on the device costs
a call of a 30-minute budget; found here it costs nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

SCRIPT = ROOT / "lab" / "gpu" / "corpus.sh"
SHIM = """#!{python}
import json, os, pathlib, sys
args = sys.argv[1:]
with open(os.environ["SHIM_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\\n")
out = pathlib.Path(args[args.index("--out") + 1])
out.mkdir(parents=True)
(out / "summary.md").write_text("# page\\n\\n## NVIDIA H200: tiers dispatch,kernels\\n\\n**8 of 10 killed**\\n\\n## The corpus\\n")
print("corpus: baseline: gate exit 0, no failing test (98 tests) in 500 s", file=sys.stderr)
"""


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    shim = tmp_path / "python3"
    shim.write_text(SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    site = tmp_path / "vllm-site"
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    log = tmp_path / "shim.log"
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": str(shim), "SHIM_LOG": str(log)}
    base |= {"VLLM_SITE": str(site), "BUDGET_S": "3000"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "res")],
        check=False,
        cwd=ROOT,
        env=base | env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def test_the_corpus_runs_both_tiers_from_the_site_and_leaves_the_power_re_run_its_share(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, JOBS="3", ONLY="int32-offs-token a-scale-0d")
    assert proc.returncode == 0, proc.stderr
    (args,) = calls
    assert args[:4] == ["-m", "moegate", "power", "corpus"] and args[4] == "run"
    opts = dict(zip(args[5::2], args[6::2], strict=False))  # every option of the run takes a value
    assert opts["--vllm-python"].endswith("python3") and opts["--site"] == str(tmp_path / "vllm-site")
    assert (
        opts["--tiers"] == "dispatch,kernels,diff"
        and opts["--jobs"] == "3"
        and opts["--out"] == str(tmp_path / "res" / "corpus")
    )
    assert 3000 - 60 - 900 - 5 <= int(opts["--budget-s"]) <= 3000 - 60 - 900  # the power re-run's 900 s kept back
    assert [args[i + 1] for i, a in enumerate(args) if a == "--only"] == ["int32-offs-token", "a-scale-0d"]
    summary = (tmp_path / "res" / "summary.txt").read_text()
    assert "corpus: exit 0" in summary and "**8 of 10 killed**" in summary
    assert "power: not run, no cosmic-ray in POWER_SITE=" in summary and "corpus.sh: done in" in summary


def test_without_the_power_re_run_the_corpus_gets_the_whole_budget(tmp_path: Path) -> None:
    proc, calls = _run(tmp_path, POWER="0")
    assert proc.returncode == 0, proc.stderr
    opts = dict(zip(calls[0][5::2], calls[0][6::2], strict=False))
    assert 3000 - 60 - 5 <= int(opts["--budget-s"]) <= 3000 - 60 and "--only" not in calls[0]
    assert "power: not run (POWER=0)" in (tmp_path / "res" / "summary.txt").read_text()


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"JOBS": "5"}, "corpus.sh: BUDGET_S is whole seconds, JOBS 1 to 4"),
        ({"BUDGET_S": "soon"}, "corpus.sh: BUDGET_S is whole seconds, JOBS 1 to 4"),
        (
            {"VLLM_SITE": "/nonexistent"},
            "corpus.sh: no vllm package in VLLM_SITE=/nonexistent (install the 0.33.0 bundle there)",
        ),
    ],
    ids=["jobs", "budget", "site"],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_runs(tmp_path: Path, env: dict[str, str], line: str) -> None:
    proc, calls = _run(tmp_path, **env)
    assert (proc.returncode, proc.stderr.strip(), calls) == (2, line, [])


def test_in_a_wave_its_own_jobs_and_tiers_win_over_the_names_the_other_scripts_read(tmp_path: Path) -> None:
    """A wave sets JOBS for compiled.sh's nvcc and TIERS for reach.sh; CORPUS_JOBS and CORPUS_TIERS are the corpus's."""
    proc, calls = _run(tmp_path, POWER="0", JOBS="16", TIERS="dispatch,kernels", CORPUS_JOBS="3",
                       CORPUS_TIERS="kernels,diff")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    opts = dict(zip(calls[0][5::2], calls[0][6::2], strict=False))
    assert (opts["--jobs"], opts["--tiers"]) == ("3", "kernels,diff")
