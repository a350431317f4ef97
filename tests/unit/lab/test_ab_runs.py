"""lab/gpu/ab_runs.sh, the lead's GPU plan for the A/B, run here with a ``python3`` that records its arguments:
every step's ``python -m moegate.ab`` command line must parse and make a valid plan, serve with CUDA graphs on
(``--enforce-eager`` only in the eager A/A), and the step must pack its run into one archive under ``$OUT``. A
typo found on the device costs a call of a 30-minute budget; found here it costs nothing."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from moegate.ab.__main__ import parser, plan_of
from moegate.ab.evidence import load_routing
from tests.support import ROOT

SCRIPT = ROOT / "lab" / "gpu" / "ab_runs.sh"

SHIM = """#!{python}
import json, os, sys
with open(os.environ["SHIM_LOG"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
args = sys.argv[1:]
if args[:2] == ["-m", "tooling.serving"]:  # the flags' one source, run for real
    os.execv(sys.executable, [sys.executable, *args])
if args[:2] == ["-m", "moegate.ab"]:
    out = args[args.index("--out") + 1]
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, "run.json"), "w").write("{}")
    print("[ab] look after round 3: c=1 equivalent", file=sys.stderr)
if args[:3] == ["-m", "moegate", "preflight"]:  # the runner's preflight, as the device's b033 interpreter runs it
    open(args[args.index("--json") + 1], "w").write(json.dumps({"uva_read_gbps": 49.7}))
    print("ok   uva: 49.7 GB/s reading pinned host memory in place (1 GiB)")
"""


def _run_step(
    tmp_path: Path, *step: str, model: bool = True, staged: bool = False
) -> tuple[list[list[str]], Path, subprocess.CompletedProcess[str]]:
    """``staged``: the 0.32.0 site is still arriving (its ``.stage`` left by a part before the last)."""
    home, out, work, shim = tmp_path / "home", tmp_path / "out", tmp_path / "work", tmp_path / "bin"
    site = home / "vllm032"
    for d in (home / "wide-text" if model else home, out, work / ".gpu" / "data" / "gsm8k", shim, site / "vllm"):
        d.mkdir(parents=True, exist_ok=True)
    if staged:
        (site / ".stage").mkdir()
    (work / ".gpu" / "data" / "sharegpt.json").write_text("[]")
    (work / ".gpu" / "data" / "gsm8k" / "train.jsonl").write_text("")
    (shim / "python3").write_text(SHIM.replace("{python}", sys.executable))
    (shim / "python3").chmod(0o755)
    (home / "b033" / "bin").mkdir(parents=True)  # the interpreter `models` makes on the device: the same shim
    (home / "b033" / "bin" / "python").symlink_to(shim / "python3")
    log = tmp_path / "calls.jsonl"
    env = {
        **os.environ,
        "HOME": str(home),
        "OUT": str(out),
        "SHIM_LOG": str(log),
        "PATH": f"{shim}:{os.environ['PATH']}",
        "SITE_WAIT_S": "0",
    }
    proc = subprocess.run(
        ["bash", str(SCRIPT), *step], cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return calls, out, proc


def _ab_plan(calls: list[list[str]]):
    (ab,) = [c for c in calls if c[:2] == ["-m", "moegate.ab"]]
    opts = parser().parse_args(ab[2:])
    return opts, plan_of(opts)


@pytest.mark.parametrize(
    ("step", "archive", "eager", "starts", "first"),
    [
        (("aa",), "aa", False, 3, 2),  # the A/A is judged by the plan the A/B is
        (("aa", "eager"), "aa-eager", True, 3, 2),
        (("text",), "ab-text-graphs", False, 3, 2),  # a first look at 2 starts a build, up to 3
    ],
    ids=["A/A, graphs on", "A/A, eager", "A/B on the text model"],
)
def test_each_step_runs_a_valid_plan_served_as_stated_and_packs_one_archive(
    tmp_path, step, archive, eager, starts, first
):
    calls, out, proc = _run_step(tmp_path, *step)
    assert proc.returncode == 0, proc.stderr
    opts, plan = _ab_plan(calls)
    server = shlex.split(opts.server_args)
    assert ("--enforce-eager" in server) == eager
    assert {"--offload-backend", "--cpu-offload-params"} <= set(server)
    assert plan.starts == starts and plan.min_starts == first and plan.output_len == 128
    assert plan.concurrency == (1, 2, 3, 4, 8) and not plan.vary_prompts and opts.resume
    # the runner's measured UVA bandwidth feeds the report's evidence columns (issue 31 item 6)
    preflight = tmp_path / "home" / f"{archive}.preflight.json"
    assert opts.moe_shape and str(opts.preflight) == str(preflight) and preflight.is_file()
    # the expert bytes a step come from the model's own greedy routing (the committed sample, as models ran nosamples)
    assert opts.routing is not None and load_routing(opts.routing)
    if step[0] == "aa":
        assert opts.base_python == opts.pr_python and opts.base_label != opts.pr_label and opts.expect_same
        assert ["-m", "moegate", "ab-spread", str(tmp_path / "home" / archive), "--same-build"] in calls
    else:
        assert opts.base_label == "0.32.0" and opts.pr_label == "0.33.0"
    with tarfile.open(out / f"{archive}.tgz") as tar:
        names = tar.getnames()
    assert f"{archive}/run.json" in names and f"{archive}.stderr" in names and f"{archive}.spread.md" in names
    assert f"{archive}.preflight.json" in names
    assert "[ab] look after round 3" in proc.stdout  # the look lines come back in the call's output


def test_a_routing_sample_made_on_the_device_is_preferred_to_the_committed_one(tmp_path):
    made = tmp_path / "home" / "models-out" / "routing-wide-text-greedy.json"
    made.parent.mkdir(parents=True)
    made.write_text(json.dumps({"1": [[[0, 1]]]}))
    calls, _, proc = _run_step(tmp_path, "text")
    assert proc.returncode == 0, proc.stderr
    opts, _ = _ab_plan(calls)
    assert str(opts.routing) == str(made)


def test_a_step_without_the_model_says_which_step_makes_it(tmp_path):
    calls, _, proc = _run_step(tmp_path, "text", model=False)
    assert proc.returncode == 2 and "run 'models text nosamples' first" in proc.stderr
    assert not any(c[:2] == ["-m", "moegate.ab"] for c in calls)


def test_the_warm_step_starts_each_build_with_the_text_runs_flags_and_model_so_its_cache_is_theirs(tmp_path):
    """vLLM's compile cache is keyed by the model path and the serving flags (the memory share left out): a warm
    start with other flags would fill a cache the A/B never reads, and its starts would still compile."""
    text_calls, _, _ = _run_step(tmp_path / "text", "text")
    opts, _ = _ab_plan(text_calls)
    calls, out, proc = _run_step(tmp_path / "warm", "warm")
    assert proc.returncode == 0, proc.stderr
    warms = [c for c in calls if c[:2] == ["-m", "lab.gpu.warm_server"]]
    home = tmp_path / "warm" / "home"
    assert sorted(w[2] for w in warms) == [str(home / f"b{v}" / "bin" / "python") for v in ("032", "033")]
    for w in warms:
        assert w[3] == str(home / "wide-text") and w[5] == opts.server_args
        assert w[w.index("--env") + 1] == "VLLM_USE_FLASHINFER_SAMPLER=0" and "--util" in w
        assert Path(w[4]).parent == out
    assert not any(c[:2] == ["-m", "moegate.ab"] for c in calls)  # it measures nothing


def test_the_warm_start_refuses_a_memory_share_outside_zero_to_one(capsys):
    from lab.gpu.warm_server import main

    with pytest.raises(SystemExit) as exc:
        main(["python", "model", "log", "", "--util", "1.5"])
    assert exc.value.code == 2 and "--util" in capsys.readouterr().err


def test_warm_and_text_do_not_build_0_32_0_from_a_site_still_arriving(tmp_path):
    """Started during the bring-up, they would otherwise make b032 from half a site (the e2e plan's fault of
    2026-12-03 (2)): they wait SITE_WAIT_S for a complete one, then stop in one line."""
    for step in ("warm", "text"):
        calls, _, proc = _run_step(tmp_path / step, step, staged=True)
        assert proc.returncode == 2 and "vllm032 is not complete" in proc.stderr
        assert not any(c[:2] in (["-m", "moegate.builds.planted"], ["-m", "lab.gpu.warm_server"]) for c in calls)
