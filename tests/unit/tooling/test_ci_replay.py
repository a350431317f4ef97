"""The CI replay's job list covers every hosted job of the workflows (tooling/ci_replay, no act needed)."""

from __future__ import annotations

import copy

import pytest

from tests.support import ROOT
from tooling.ci_replay.jobs import RUNS, hosted_jobs, replayed, run_for, unreplayed

yaml = pytest.importorskip("yaml", reason="PyYAML is not installed here (the unit env has it: nox -s unit)")


def _workflows() -> dict:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted((ROOT / ".github" / "workflows").glob("*.yml"))}


def test_the_replay_runs_every_hosted_job_of_the_workflows_and_nothing_else():
    assert unreplayed(_workflows()) == []


def test_a_new_hosted_job_missing_from_the_replay_is_named():
    wfs = copy.deepcopy(_workflows())
    wfs["gate.yml"]["jobs"]["docs"] = {"runs-on": "ubuntu-24.04", "steps": [{"run": "true"}]}
    assert unreplayed(wfs) == [
        "gate.yml:docs: a hosted job the replay does not run (add it to tooling/ci_replay/jobs.py RUNS)"
    ]


def test_a_replayed_job_that_left_the_workflows_is_named():
    wfs = copy.deepcopy(_workflows())
    del wfs["moegate.yml"]["jobs"]["meta"]
    assert unreplayed(wfs) == ["moegate.yml:meta: replayed, but not a hosted job of the workflows"]


def test_self_hosted_and_calling_jobs_are_not_hosted_jobs():
    hosted = hosted_jobs(_workflows())
    assert "moegate.yml:gpu" not in hosted and "gate.yml:moegate" not in hosted
    assert {"gate.yml:lint", "gate.yml:power", "moegate.yml:plan", "moegate.yml:verdict"} <= set(hosted)


def test_each_replayed_job_runs_on_an_event_that_triggers_it():
    wfs = _workflows()
    on = wfs["gate.yml"].get("on", wfs["gate.yml"].get(True))
    for run in RUNS:
        assert run.event in on, run
        for job in run.jobs:
            workflow, _, job_id = job.partition(":")
            condition = str(wfs[workflow]["jobs"][job_id].get("if", ""))
            if "github.event_name ==" in condition:
                assert f"'{run.event}'" in condition, (job, condition)


def test_one_job_alone_is_replayed_with_what_act_must_run_with_it():
    assert run_for("lint").target == "lint" and run_for("gate.yml:power").event == "workflow_dispatch"
    assert run_for("dispatch").target == "moegate" and "moegate.yml:plan" in run_for("dispatch").jobs
    assert run_for("gate").target is None and run_for("gate").jobs == RUNS[0].jobs
    with pytest.raises(KeyError, match="'gpu' is not a replayed job"):
        run_for("gpu")
    assert len(replayed()) == len(set(replayed()))


def test_the_verdict_replays_stand_ins_still_apply_to_the_examples(tmp_path):
    """The two checkouts of moegate the verdict's replay stands in for are still there, as it rewrites them."""
    from tooling.ci_replay import verdict_replay as vr
    from tooling.ci_replay.common import ReplayError

    verdict = yaml.safe_load(vr.verdict_workflow(tmp_path / "verdict.yml").read_text())
    checkout = next(
        s for s in verdict["jobs"]["verdict"]["steps"] if str(s.get("uses", "")).startswith("actions/checkout@")
    )
    assert "repository" not in checkout["with"] and "ref" not in checkout["with"]
    caller = (ROOT / "examples" / "vllm-caller.yml").read_text()
    jobs = yaml.safe_load(vr.caller_workflow(caller, tmp_path / "caller.yml", wheels=True).read_text())["jobs"]
    assert [s.get("run", "").split("  #")[0] for s in jobs["changes"]["steps"][:2]] == [
        "",
        'cp -a "$MOEGATE_REPLAY_MOEGATE" .moegate',
    ]
    assert [s.get("run", "").split("  #")[0] for s in jobs["wheels"]["steps"][:2]] == [
        'cp -a "$MOEGATE_REPLAY_VLLM" vllm',  # act skips a checkout of the repository it runs, whatever its path
        'cp -a "$MOEGATE_REPLAY_MOEGATE" moegate',
    ]
    with pytest.raises(ReplayError, match="stand-in 'moegate checkout -> cp of the copy' no longer applies"):
        vr.caller_workflow(caller.replace("repository: your-org/moegate", "repository: o/m"), tmp_path / "caller.yml")
    with pytest.raises(ReplayError, match="stand-in 'vLLM checkout into vllm/ -> cp of the repository' no longer"):
        vr.caller_workflow(caller.replace("path: vllm", "path: src"), tmp_path / "caller.yml", wheels=True)


def test_the_download_stand_in_lays_artifacts_out_as_download_artifact_does(tmp_path):
    import os
    import subprocess
    import sys

    from tooling.ci_replay.standins import DOWNLOAD_STUB_SCRIPT

    kept = tmp_path / "artifacts"
    for name in ("moegate-dispatch-attempt1", "moegate-kernels-pr-attempt1", "vllm-wheels"):
        (kept / name / "reports").mkdir(parents=True)
        (kept / name / "reports" / "leg.json").write_text(name)
    script = tmp_path / "download.py"
    script.write_text(DOWNLOAD_STUB_SCRIPT)

    def download(dest: str, **inputs: str) -> subprocess.CompletedProcess[str]:
        env = {"NAME": "", "PATTERN": "", "DEST": str(tmp_path / dest), "MERGE": "false", "RUN_ID": "", **inputs}
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False,
                              env={**os.environ, "MOEGATE_REPLAY_ARTIFACTS": str(kept), **env})  # fmt: skip

    assert download("legs", PATTERN="moegate-*-attempt1").returncode == 0
    assert sorted(p.name for p in (tmp_path / "legs").iterdir()) == [
        "moegate-dispatch-attempt1",
        "moegate-kernels-pr-attempt1",
    ]
    assert download("one", NAME="vllm-wheels").returncode == 0
    assert (tmp_path / "one" / "reports" / "leg.json").read_text() == "vllm-wheels"
    assert "Artifact not found for name: nope" in download("x", NAME="nope").stdout + download("x", NAME="nope").stderr
    assert download("x", RUN_ID="123").returncode == 1


def test_the_upload_stand_in_keeps_files_relative_to_the_search_paths_common_ancestor(tmp_path):
    """As upload-artifact stores them: one directory's files without it (the wheels job's ``$RUNNER_TEMP/wheels/``
    holds ``base/``, ``pr/``, ``compiled/``), several paths' under their common ancestor, one file as itself."""
    import os
    import subprocess
    import sys

    from tooling.ci_replay.standins import UPLOAD_STUB_SCRIPT

    ws, temp, kept = tmp_path / "ws", tmp_path / "temp", tmp_path / "artifacts"
    for f in (ws / "reports" / "a.md", ws / "golden" / "x" / "y.obtained", ws / ".hypothesis" / "db",
              temp / "wheels" / "base" / "v.whl"):  # fmt: skip
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f.name)
    script = tmp_path / "upload.py"
    script.write_text(UPLOAD_STUB_SCRIPT)

    def upload(name: str, paths: str, hidden: str = "false") -> list[str]:
        env = {"NAME": name, "PATHS": paths, "HIDDEN": hidden, "IF_NONE": "warn", "OVERWRITE": "false"}
        subprocess.run([sys.executable, str(script)], cwd=ws, check=True, capture_output=True,
                       env={**os.environ, "MOEGATE_REPLAY_ARTIFACTS": str(kept), **env})  # fmt: skip
        return sorted(str(p.relative_to(kept / name)) for p in (kept / name).rglob("*") if p.is_file())

    assert upload("wheels", f"{temp}/wheels/") == ["base/v.whl"]
    assert upload("legs", "reports/\ngolden/**/*.obtained\n.hypothesis/", "true") == [
        ".hypothesis/db", "golden/x/y.obtained", "reports/a.md"]  # fmt: skip
    assert upload("db", ".hypothesis/", "true") == ["db"]
    assert upload("one", "reports/a.md") == ["a.md"]
