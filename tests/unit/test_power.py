"""The power harness's own guarantees, on small synthetic vLLM-shaped packages (no vLLM, no torch).

- the region finder picks exactly the named functions/lines, by structure, and
  fails with one error naming everything it looked for and did not find;
- a missing cosmic-ray is one line with the install command;
- mutant ids are stable when code above the function moves;
- the overlay copies (never links) the mutated files, so cosmic-ray's in-place
  writes cannot reach the installed package;
- the installed files are byte-identical after a run that is SIGKILLed or
  SIGINTed while a mutant is applied (needs cosmic-ray: skipped without it, with
  the reason; `nox -s power` runs these first, in the tool's environment);
- a run not on a terminal writes one progress line per stage, with the report's counts.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from moegate.power import summary_line
from moegate.power.cli import main
from moegate.power.driver import require_tool
from moegate.power.errors import PowerError, TargetNotFound, ToolMissing
from moegate.power.outcome import Mutant, Outcome, load_equivalents, mutant_id
from moegate.power.overlay import WORKDIR_PREFIX, build_overlay, clean_stale_workdirs
from moegate.power.regions import FUSED_MOE, TRITON_MOE, find_regions
from moegate.power.report import render_markdown
from moegate.power.run import EQUIVALENTS_FILE, ROOT
from moegate.serve.processes import descendants

FUSED = textwrap.dedent(
    '''\
    """A synthetic stand-in for vllm's fused_moe.py: same names, tiny bodies."""


    def helper():
        return 1


    def _weights_host_resident(*weights):
        """Docstring: not mutated."""
        return any(getattr(w, "_vllm_is_uva_offloaded", False) for w in weights)


    def _prepare_expert_assignment(topk_ids, config, num_tokens, top_k_num, global_num_experts, expert_map, *, weights_host_resident=False):
        """Docstring."""
        naive = expert_map is None and not weights_host_resident and num_tokens * top_k_num * 4 <= global_num_experts
        return "naive" if naive else "sorted"


    def fused_experts_impl(w1, w2, topk_ids, global_num_experts=-1):
        E = len(w1)
        if global_num_experts == -1:
            global_num_experts = E
        return _prepare_expert_assignment(
            topk_ids,
            {},
            len(topk_ids),
            1,
            global_num_experts,
            None,
            weights_host_resident=_weights_host_resident(w1, w2),
        )
    '''
)

TRITON = textwrap.dedent(
    """\
    from vllm.model_executor.layers.fused_moe.fused_moe import _prepare_expert_assignment, _weights_host_resident


    class TritonExperts:
        def apply(self, w1, w2, topk_ids, global_num_experts, expert_map):
            num_align_experts = len(w1) if expert_map is None else global_num_experts
            return _prepare_expert_assignment(
                topk_ids, {}, len(topk_ids), 1, num_align_experts, expert_map,
                weights_host_resident=_weights_host_resident(w1, w2),
            )


    class TritonWNA16Experts(TritonExperts):
        def apply(self, w1, w2, topk_ids, global_num_experts, expert_map):
            num_align_experts = 0
            return num_align_experts
    """
)


def _lines_of(text: str, needle: str) -> int:
    """1-based number of the first line containing ``needle`` (or equal to it, stripped, for a bare argument)."""
    lines = text.splitlines()
    exact = [i for i, line in enumerate(lines, 1) if line.strip() == needle.strip()]
    return exact[0] if exact else next(i for i, line in enumerate(lines, 1) if needle in line)


def _sources(fused: str = FUSED, triton: str = TRITON) -> dict[str, str]:
    return {FUSED_MOE: fused, TRITON_MOE: triton}


def _fake_vllm(root: Path, fused: str = FUSED, triton: str = TRITON) -> Path:
    """A site-packages-like dir with a `vllm` package holding the two target files and a bystander."""
    pkg = root / "vllm"
    for rel, text in {FUSED_MOE: fused, TRITON_MOE: triton}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    (pkg / "__init__.py").write_text("__version__ = 'synthetic'\n")
    (pkg / "model_executor" / "other.py").write_text("X = 1\n")
    (pkg / "model_executor" / "layers" / "fused_moe" / "__pycache__").mkdir()
    (pkg / "model_executor" / "layers" / "fused_moe" / "__pycache__" / "fused_moe.cpython-311.pyc").write_bytes(
        b"stale"
    )
    return pkg


# --- region finder -------------------------------------------------------------------


def test_regions_cover_exactly_the_named_functions_and_lines() -> None:
    regions = find_regions(_sources())
    got = {(r.spec.scope, r.spec.kind, r.first, r.last) for r in regions}
    body_whr = _lines_of(FUSED, "return any(")
    decide = _lines_of(FUSED, "naive = expert_map")
    ret = _lines_of(FUSED, 'return "naive"')
    count_arg = _lines_of(FUSED, "            global_num_experts,")
    flag_arg = _lines_of(FUSED, "weights_host_resident=_weights_host_resident(w1, w2)")
    assign = _lines_of(TRITON, "num_align_experts = len(w1)")
    call_line = _lines_of(TRITON, "topk_ids, {}, len(topk_ids), 1, num_align_experts")
    flag_t = _lines_of(TRITON, "weights_host_resident=_weights_host_resident(w1, w2)")
    assert got == {
        ("_weights_host_resident", "body", body_whr, body_whr),  # docstring excluded
        ("_prepare_expert_assignment", "body", decide, ret),
        ("fused_experts_impl", "call-args", count_arg, count_arg),  # positional: resolved by parameter name
        ("fused_experts_impl", "call-args", flag_arg, flag_arg),
        ("TritonExperts.apply", "assign", assign, assign),  # not TritonWNA16Experts.apply's
        ("TritonExperts.apply", "call-args", call_line, call_line),
        ("TritonExperts.apply", "call-args", flag_t, flag_t),
    }
    # the `if global_num_experts == -1` default and the helper are out of scope
    default_line = _lines_of(FUSED, "if global_num_experts == -1")
    helper_line = _lines_of(FUSED, "return 1")
    assert not any(r.contains(default_line) or r.contains(helper_line) for r in regions)


def test_keyword_expert_count_is_found_too() -> None:
    fused = FUSED.replace(
        "        global_num_experts,\n        None,\n",
        "        global_num_experts=global_num_experts,\n        expert_map=None,\n",
    )
    assert fused != FUSED
    regions = find_regions(_sources(fused=fused))
    line = _lines_of(fused, "global_num_experts=global_num_experts,")
    assert any(r.spec.scope == "fused_experts_impl" and r.first == line for r in regions)


def test_missing_functions_give_one_error_naming_each() -> None:
    fused = FUSED.replace("def _weights_host_resident", "def _renamed_residency").replace(
        "def _prepare_expert_assignment", "def _renamed_assignment"
    )
    with pytest.raises(TargetNotFound) as exc:
        find_regions(_sources(fused=fused), where="vLLM 9.9.9")
    msg = str(exc.value)
    assert msg.startswith("vLLM 9.9.9 does not contain the dispatch code")
    assert "function _weights_host_resident in model_executor/layers/fused_moe/fused_moe.py" in msg
    assert "function _prepare_expert_assignment in" in msg
    assert "\n" not in msg  # one line


def test_missing_argument_and_method_are_named() -> None:
    triton = TRITON.replace("weights_host_resident=_weights_host_resident(w1, w2),", "").replace(
        "class TritonExperts:", "class TritonExpertsRenamed:"
    )
    with pytest.raises(TargetNotFound, match=r"function TritonExperts\.apply in .*triton_moe\.py"):
        find_regions(_sources(triton=triton))
    triton = TRITON.replace("weights_host_resident=_weights_host_resident(w1, w2),", "")
    with pytest.raises(
        TargetNotFound,
        match="argument weights_host_resident in the call to _prepare_expert_assignment in TritonExperts.apply",
    ):
        find_regions(_sources(triton=triton))


def test_missing_file_is_named() -> None:
    with pytest.raises(TargetNotFound, match="file model_executor/layers/fused_moe/experts/triton_moe.py"):
        find_regions({FUSED_MOE: FUSED})


def test_missing_tool_is_one_line_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cosmic_ray" else real(name, *a))
    with pytest.raises(ToolMissing) as exc:
        require_tool()
    assert "pip install 'cosmic-ray" in str(exc.value) and "\n" not in str(exc.value)
    previous = signal.getsignal(signal.SIGTERM)  # main() installs its own SIGTERM handler
    try:
        rc = main(["--vllm-python", sys.executable, "--package-dir", "/nonexistent"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert rc == 2


def test_mutant_ids_do_not_move_with_code_above_the_function() -> None:
    before = find_regions(_sources())
    shifted = find_regions(_sources(fused="# a new comment\n\n\n" + FUSED))
    for a, b in zip(before, shifted, strict=True):
        assert b.first == a.first + (3 if a.spec.file == FUSED_MOE else 0)
        assert mutant_id(a, "core/NumberReplacer", a.first, 4) == mutant_id(b, "core/NumberReplacer", b.first, 4)
    assert mutant_id(before[1], "core/ReplaceComparisonOperator_LtE_Lt", before[1].first, 9).startswith(
        "fused_moe:_prepare_expert_assignment:ReplaceComparisonOperator_LtE_Lt@+"
    )


# --- equivalents, plugin line, report --------------------------------------------------


def test_equivalent_entries_need_a_reason(tmp_path: Path) -> None:
    f = tmp_path / "eq.toml"
    f.write_text('[mutant."a:b:C@+1:2"]\nreason = "because"\n')
    assert load_equivalents(f) == {"a:b:C@+1:2": "because"}
    f.write_text('[mutant."a:b:C@+1:2"]\nreason = ""\n')
    with pytest.raises(PowerError, match="has no reason"):
        load_equivalents(f)


def test_the_committed_equivalents_file_parses() -> None:
    assert isinstance(load_equivalents(EQUIVALENTS_FILE), dict)


def test_plugin_line_is_read_back() -> None:
    out = "....F\n" + summary_line.MARK + ' {"first_failure_s": 1.5, "failing_test": "t"}\n1 failed\n'
    assert summary_line.read(out) == {"first_failure_s": 1.5, "failing_test": "t"}
    assert summary_line.read("no line") is None
    assert summary_line.read(None) is None


def test_report_shows_score_and_survivor_diff() -> None:
    ms = [
        Mutant("k", "1", "f", 10, "core/X", "r", status="killed", first_failure_s=2.0, failing_test="t1"),
        Mutant("s", "2", "f", 11, "core/Y", "r", status="survived", diff="-a\n+b"),
        Mutant("e", "3", "f", 12, "core/Z", "r", status="equivalent", reason="same for all inputs"),
    ]
    o = Outcome("9.9", "/p", "nox -s power", "pytest", [], ms, {"wall_s": 1}, 3.0, {}, True)
    assert o.score == 0.5 and not o.passed
    md = render_markdown(o)
    assert "FAIL: mutation score 50.0 %" in md
    assert "### `s` (survived)" in md and "-a\n+b" in md
    assert "- `e`: same for all inputs" in md
    assert "| `k` | 10 | 2.00 |" in md
    ms[1].status = "equivalent"
    assert Outcome("9.9", "/p", "", "", [], ms, {}, 1.0, {}, True).passed


# --- the overlay and the installed files ---------------------------------------------------


def _digest(pkg: Path) -> dict[str, str]:
    return {
        str(p.relative_to(pkg)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(pkg.rglob("*"))
        if p.is_file()
    }


def test_overlay_copies_the_mutated_files_and_links_the_rest(tmp_path: Path) -> None:
    pkg = _fake_vllm(tmp_path / "site")
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


def test_overlay_shadows_the_installed_package(tmp_path: Path) -> None:
    pkg = _fake_vllm(tmp_path / "site")
    copies = build_overlay(pkg, tmp_path / "overlay", [FUSED_MOE, TRITON_MOE])
    copies[FUSED_MOE].write_text("WHERE = 'overlay'\n")
    code = "import vllm.model_executor.layers.fused_moe.fused_moe as m, vllm; print(m.WHERE, vllm.__version__)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "overlay"), str(tmp_path / "site")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["overlay", "synthetic"]


def test_stale_overlays_of_dead_runs_are_removed(tmp_path: Path) -> None:
    dead = tmp_path / (WORKDIR_PREFIX + "dead")
    live = tmp_path / (WORKDIR_PREFIX + "live")
    for d, pid in ((dead, 2**22 + 12345), (live, os.getpid())):
        d.mkdir()
        (d / "owner.pid").write_text(str(pid))
    assert clean_stale_workdirs(tmp_path) == [dead]
    assert live.exists() and not dead.exists()


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


def _start_run(tmp_path: Path, pkg: Path) -> subprocess.Popen[bytes]:
    """A power run whose test command passes at once on unmutated code and hangs on a mutant."""
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
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
        _power_argv(pkg, tmp_path / "out", f"{sys.executable} {probe} {original}", timeout_s=120),
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
    pkg = _fake_vllm(tmp_path / "site")
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
    if sig != signal.SIGKILL:  # a catchable signal: the harness removed its overlay itself
        assert not mutated.exists()
    else:  # killed outright: the next run removes the dead run's overlay
        assert mutated.exists()
        removed = clean_stale_workdirs(tmp_path / "tmp")
        assert removed and not mutated.exists()


@needs_tool
def test_a_full_run_on_a_synthetic_package_scores_and_restores(tmp_path: Path) -> None:
    """End to end with a test command that kills exactly the mutants that change `<=` semantics at the boundary."""
    pkg = _fake_vllm(tmp_path / "site")
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
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        _power_argv(pkg, tmp_path / "out", f"{sys.executable} {probe}", timeout_s=30),
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
