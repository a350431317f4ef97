"""Gate power's overlay and the installed files: the mutants' copies shadow the installed vLLM, which no run (interrupted, killed or finished) ever changes."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from moegate.builds.planted import make_build
from moegate.power import overlay
from moegate.power.outcome import BUILD_PYTHON
from moegate.power.overlay import WORKDIR_PREFIX, build_overlay, clean_stale_workdirs, make_workdir
from moegate.power.regions import FUSED_MOE, TRITON_MOE
from moegate.power.run import ROOT, make_test_build
from moegate.serve.processes import descendants
from tests.support.power import FUSED, fake_vllm

# --- the overlay and the installed files ---------------------------------------------------


def _digest(pkg: Path) -> dict[str, str]:
    return {
        str(p.relative_to(pkg)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(pkg.rglob("*"))
        if p.is_file()
    }


def test_overlay_copies_the_mutated_files_and_links_the_rest(tmp_path: Path) -> None:
    pkg = fake_vllm(tmp_path / "site")
    before = _digest(pkg)
    copies = build_overlay(pkg, tmp_path / "overlay", [FUSED_MOE, TRITON_MOE])
    for rel, copy in copies.items():
        assert not copy.is_symlink()
        assert os.stat(copy).st_ino != os.stat(pkg / rel).st_ino  # writing the copy cannot reach the installed file
        copy.write_text("MUTATED = True\n")
    ov = tmp_path / "overlay" / "vllm"
    assert (ov / "__init__.py").is_symlink() and (ov / "model_executor" / "other.py").is_symlink()
    assert not (ov / "model_executor" / "layers" / "fused_moe" / "__pycache__").exists()  # no stale pyc for a mutant
    assert _digest(pkg) == before


def test_overlay_shadows_the_installed_package_in_the_test_build_and_its_subprocesses(tmp_path: Path) -> None:
    """The test build: this interpreter's packages plus the fake vLLM's site, the overlay and a suite before them."""
    pkg = fake_vllm(tmp_path / "site")
    copies = build_overlay(pkg, tmp_path / "overlay", [FUSED_MOE, TRITON_MOE])
    copies[FUSED_MOE].write_text("WHERE = 'overlay'\n")
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "suite_marker.py").write_text("WHERE = 'suite'\n")
    python = make_build(tmp_path / "build", sys.executable, sites=(str(tmp_path / "site"),))
    build = make_test_build(tmp_path / "work", str(python), tmp_path / "overlay", tmp_path / "suite")
    code = (
        "import vllm.model_executor.layers.fused_moe.fused_moe as m, vllm, suite_marker, subprocess, sys; "
        "print(m.WHERE, vllm.__version__, suite_marker.WHERE); sys.stdout.flush(); "
        "subprocess.run([sys.executable, '-c', 'import vllm.model_executor.layers.fused_moe.fused_moe as m; "
        "print(m.WHERE)'], check=True)"
    )
    out = subprocess.run([str(build), "-c", code], cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["overlay", "synthetic", "suite", "overlay"]  # the child too: sys.executable
    plain = subprocess.run(
        [str(python), "-c", "import vllm.model_executor.layers.fused_moe.fused_moe as m; print(m.__file__)"],
        cwd="/", capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert plain.stdout.strip() == str(pkg / FUSED_MOE)  # without the overlay: the installed file


def test_stale_overlays_of_dead_runs_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / (WORKDIR_PREFIX + "dead")
    live = tmp_path / (WORKDIR_PREFIX + "live")
    for d, pid in ((dead, 2**22 + 12345), (live, os.getpid())):
        d.mkdir()
        (d / "owner.pid").write_text(str(pid))
    assert clean_stale_workdirs(tmp_path) == [dead]
    assert live.exists() and not dead.exists()


def test_a_run_starting_beside_another_never_removes_its_new_work_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = tempfile.mkdtemp

    def cleaned_at_the_worst_moment(**kw: object) -> str:
        path = made(**kw)  # type: ignore[call-overload]
        clean_stale_workdirs(tmp_path)  # another shard starting now
        return str(path)

    monkeypatch.setattr(overlay.tempfile, "mkdtemp", cleaned_at_the_worst_moment)
    work = make_workdir(tmp_path)
    assert work.name.startswith(WORKDIR_PREFIX) and (work / "owner.pid").read_text() == str(os.getpid())
    assert clean_stale_workdirs(tmp_path) == [] and work.exists()


needs_tool = pytest.mark.skipif(
    importlib.util.find_spec("cosmic_ray") is None,
    reason="needs cosmic-ray (pip install 'cosmic-ray>=8.7,<9'); `nox -s power` runs this in its tool env",
)


def _power_argv(pkg: Path, out: Path, test_command: str, *, timeout_s: int) -> list[str]:
    """`python -m moegate.power` on a fake vLLM package, this interpreter standing in for vLLM's."""
    return [
        sys.executable, "-m", "moegate.power", "--vllm-python", sys.executable, "--package-dir", str(pkg),
        "--out", str(out), "--test-command", test_command, "--timeout", str(timeout_s),
    ]  # fmt: skip


_ENV = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
"""The power runs below get no job summary to write to (these tests run with --noconftest, so the root conftest's
rule does not reach them): in the replayed power job this module's synthetic run put a FAIL page on the summary."""


def _start_run(tmp_path: Path, pkg: Path) -> subprocess.Popen[bytes]:
    """A power run whose test command passes at once on unmutated code and hangs on a mutant."""
    env = {**_ENV, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    original = tmp_path / "original.py"
    original.write_text(FUSED)
    probe = tmp_path / "hang_on_mutant.py"
    probe.write_text(
        "import importlib.util, pathlib, sys, time\n"
        "origin = importlib.util.find_spec('vllm.model_executor.layers.fused_moe.fused_moe').origin\n"
        "if pathlib.Path(origin).read_text() != pathlib.Path(sys.argv[1]).read_text():\n"
        "    time.sleep(60)\n"
    )
    return subprocess.Popen(
        _power_argv(pkg, tmp_path / "out", f"{BUILD_PYTHON} {probe} {original}", timeout_s=120),
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _wait_for_applied_mutant(tmp_path: Path, original: str, proc: subprocess.Popen[bytes], limit_s: float = 90) -> Path:
    """Poll until an overlay copy differs from the original: a mutant is on disk right now."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for copy in (tmp_path / "tmp").glob(WORKDIR_PREFIX + "*/overlay/vllm/" + FUSED_MOE):
            try:
                if copy.read_text() != original:
                    return copy
            except OSError:
                pass
        if proc.poll() is not None:
            pytest.fail(f"power run ended before a mutant was applied: {proc.stdout.read().decode()[-2000:]}")  # type: ignore[union-attr]
        time.sleep(0.1)
    pytest.fail("no mutant was applied within the time limit")


@needs_tool
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_installed_files_unchanged_when_the_run_is_interrupted(tmp_path: Path, sig: signal.Signals) -> None:
    pkg = fake_vllm(tmp_path / "site")
    before = _digest(pkg)
    proc = _start_run(tmp_path, pkg)
    try:
        mutated = _wait_for_applied_mutant(tmp_path, FUSED, proc)
        assert _digest(pkg) == before  # the mutant is in the overlay only
        victims = [*descendants(proc.pid), proc.pid] if sig == signal.SIGKILL else [proc.pid]
        for pid in victims:  # SIGKILL: the harness and everything it started, nothing can clean up
            os.kill(pid, sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            for pid in [*descendants(proc.pid), proc.pid]:
                os.kill(pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert _digest(pkg) == before
    if sig != signal.SIGKILL:  # a catchable signal: the harness removed its overlay itself, and kept what ran
        assert not mutated.exists()
        report = json.loads((tmp_path / "out" / "power.json").read_text())
        pending = [m for m in report["mutants"] if m["status"] == "pending"]
        assert report["cut"].startswith("cut by signal") and pending, report
        assert "not run**: cut by signal" in (tmp_path / "out" / "power.md").read_text()
    else:  # killed outright: the next run removes the dead run's overlay
        assert mutated.exists()
        removed = clean_stale_workdirs(tmp_path / "tmp")
        assert removed and not mutated.exists()


@needs_tool
def test_a_full_run_on_a_synthetic_package_scores_and_restores(tmp_path: Path) -> None:
    """End to end with a test command that kills exactly the mutants that change `<=` semantics at the boundary."""
    pkg = fake_vllm(tmp_path / "site")
    before = _digest(pkg)
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        "from vllm.model_executor.layers.fused_moe.fused_moe import _prepare_expert_assignment as p\n"
        "ok = p(None, {}, 2, 8, 64, None) == 'naive' and p(None, {}, 2, 8, 63, None) == 'sorted'\n"
        "ok = ok and p(None, {}, 1, 1, 64, None, weights_host_resident=True) == 'sorted'\n"
        'print(\'MOEGATE-POWER \' + (\'{"first_failure_s": null}\' if ok else \'{"first_failure_s": 0.0, "failing_test": "probe"}\'))\n'
        "sys.exit(0 if ok else 1)\n"
    )
    env = {**_ENV, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        _power_argv(pkg, tmp_path / "out", f"{BUILD_PYTHON} {probe}", timeout_s=30),
        env=env,
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads((tmp_path / "out" / "power.json").read_text())
    statuses = {m["id"]: m["status"] for m in report["mutants"]}
    assert statuses, out.stderr
    line = next(ln for ln in FUSED.splitlines() if "naive = expert_map" in ln)
    lte = f"fused_moe:_prepare_expert_assignment:ReplaceComparisonOperator_LtE_Lt@+2:{line.index('<=')}"
    assert statuses[lte] == "killed"
    assert (
        "survived" in statuses.values() and out.returncode == 1
    )  # the probe is weak on purpose: survivors fail the run
    assert report["installed_unchanged"] is True and _digest(pkg) == before
    assert "## Survivors" in (tmp_path / "out" / "power.md").read_text()
    # progress, not a terminal: one line per stage, its counts those of the report
    n, killed, survived = (
        len(statuses),
        sum(s == "killed" for s in statuses.values()),
        sum(s == "survived" for s in statuses.values()),
    )
    stage_lines = [ln for ln in out.stderr.splitlines() if ln.startswith("power: ") and ln.endswith(" s)")]
    assert [ln.split(":")[1] for ln in stage_lines] == [" baseline (unmutated vLLM)", " mutants"], out.stderr
    assert stage_lines[1].startswith(
        f"power: mutants: {n}/{n}, killed {killed}, survived {survived}, score {100 * report['score']:.1f} % ("
    ), stage_lines[1]
