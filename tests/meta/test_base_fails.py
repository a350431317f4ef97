"""The gate's own power against the real base: vLLM 0.32.0 must fail, for the right reason.

Runs the dispatch tier in the base environment (``MOEGATE_META_PYTHON``) and
passes only if:

- pytest ran and reported failures (exit 1; not a crash, not "no tests");
- exactly the properties that draw host-resident cases failed, at both
  entrypoints, and every property that draws only device-resident, expert-map,
  grouped-wNa16 or outside-the-region cases passed;
- every counterexample is host-resident, the spec requires sorted for it, the base
  took naive, which is what the rule without the host clause says;
- the dispatch table differs from the golden in host-resident rows only.

The dispatch tier runs under the ``shrink`` profile (no pinned examples), so the
counterexamples printed below are Hypothesis's own, shrunk.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from moegate.core import golden_files
from moegate.core.case import MoECase
from moegate.core.check import parse_mismatches
from moegate.core.spec import expected_path
from tests.support import ROOT

MUST_FAIL = {
    "test_path_matches_spec[legacy]",
    "test_path_matches_spec[modular]",
    "test_host_resident_weights_take_sorted_path[legacy]",
    "test_host_resident_weights_take_sorted_path[modular]",
    "test_fp8_follows_the_unquantized_rule[legacy]",  # draws every placement, fp8 weights
    "test_fp8_follows_the_unquantized_rule[modular]",
}
MAY_FAIL = {"test_wna16_per_channel_follows_spec[legacy]"}  # per-channel wNa16 on the host: also the host rule
MUST_PASS = {
    f"{name}[{ep}]"
    for name in (
        "test_device_weights_in_naive_region_take_naive_path",
        "test_outside_naive_region_takes_sorted_path",
        "test_expert_map_takes_sorted_path",
        "test_wna16_with_group_size_takes_sorted_path",
    )
    for ep in ("legacy", "modular")
}


@pytest.fixture(scope="module")
def obtained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base run's obtained files: its own folder, not beside the goldens, where the dispatch tier's run on 0.33.0
    (the other lane of the test command) removes them as it passes."""
    return tmp_path_factory.mktemp("obtained")


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory, obtained_dir: Path) -> tuple[int, ET.Element, str]:
    py = os.environ.get("MOEGATE_META_PYTHON")
    if not py:
        pytest.skip(
            "set MOEGATE_META_PYTHON to the base (vLLM 0.32.0) environment's python; `nox -s meta-base-fails` does"
        )
    out = tmp_path_factory.mktemp("base")
    junit = out / "base.xml"
    env = {
        **os.environ,
        "MOEGATE_PROFILE": "shrink",
        "MOEGATE_REQUIRE_VLLM": "1",
        "MOEGATE_OBTAINED_DIR": str(obtained_dir),
    }
    proc = subprocess.run(
        [py, "-m", "pytest", "tests/dispatch", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    (out / "base.log").write_text(proc.stdout + proc.stderr)
    if not junit.exists():
        pytest.fail(
            f"the base run wrote no report (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    return proc.returncode, ET.parse(junit).getroot(), proc.stdout


def _outcomes(root: ET.Element) -> dict[str, str]:
    result = {}
    for tc in root.iter("testcase"):
        name = tc.get("name", "")
        failed = tc.find("failure") is not None or tc.find("error") is not None
        skipped = tc.find("skipped") is not None
        result[name] = "failed" if failed else "skipped" if skipped else "passed"
    return result


def _failure_texts(root: ET.Element) -> dict[str, str]:
    texts = {}
    for tc in root.iter("testcase"):
        node = tc.find("failure")
        if node is None:
            node = tc.find("error")
        if node is not None:
            texts[tc.get("name", "")] = (node.get("message") or "") + "\n" + (node.text or "")
    return texts


def test_base_run_failed_rather_than_crashed(base_run):
    rc, root, _ = base_run
    assert rc == 1, f"pytest on the base exited {rc}: 1 means tests failed; anything else is a crash or no tests"
    outcomes = _outcomes(root)
    assert "skipped" not in outcomes.values(), f"the base run skipped tests: {outcomes}"


def test_base_fails_host_properties_and_passes_the_rest(base_run):
    _, root, _ = base_run
    outcomes = _outcomes(root)
    props = {k: v for k, v in outcomes.items() if not k.startswith("test_dispatch_table")}
    failed = {k for k, v in props.items() if v == "failed"}
    assert MUST_FAIL <= failed, f"host-resident properties that passed on the base: {sorted(MUST_FAIL - failed)}"
    assert not failed - MUST_FAIL - MAY_FAIL, (
        f"unexpected failures on the base: {sorted(failed - MUST_FAIL - MAY_FAIL)}"
    )
    passed = {k for k, v in props.items() if v == "passed"}
    assert MUST_PASS <= passed, f"properties that must pass on the base did not: {sorted(MUST_PASS - passed)}"


def test_every_counterexample_is_host_resident_and_explained_by_the_old_rule(base_run):
    _, root, _ = base_run
    texts = _failure_texts(root)
    entrypoints = set()
    print("\nshrunk counterexamples on the base (vLLM 0.32.0):")
    for name, text in sorted(texts.items()):
        if name.startswith("test_dispatch_table"):
            continue
        records = parse_mismatches(text)
        assert records, f"{name} failed without a dispatch mismatch (a crash?):\n{text[:2000]}"
        for rec in records:
            case = MoECase.from_dict(rec["case"])
            assert case.placement.host_resident, f"{name}: counterexample is not host-resident: {case.short()}"
            assert rec["expected"] == "sorted" and rec["observed"] == "naive", rec
            assert expected_path(case, rec["entrypoint"], host_rule=False).path.value == rec["observed"]
            entrypoints.add(rec["entrypoint"])
        rec = records[-1]  # Hypothesis reports the final, shrunk example
        case = MoECase.from_dict(rec["case"])
        print(f"  {name}: {rec['entrypoint']} took {rec['observed']}, spec {rec['expected']}: {case.short()}")
    assert entrypoints == {"legacy", "modular"}, f"the base failed at only {entrypoints}"


def test_table_diff_on_base_is_host_rows_only(base_run, obtained_dir):
    _, root, _ = base_run
    assert _outcomes(root).get("test_dispatch_table_matches_golden") == "failed"
    path = golden_files.GOLDEN_DIR / "dispatch-table.tsv"
    obtained = obtained_dir / (path.name + ".obtained")
    want = golden_files.body(path.read_text()).splitlines()
    got = golden_files.body(obtained.read_text()).splitlines()
    assert len(want) == len(got)
    changed = [(w, g) for w, g in zip(want, got) if w != g]
    assert changed, "the base produced the same table as the PR"
    for w, g in changed:
        cols = w.split("\t")
        assert cols[2] != "device", f"a device-resident row changed on the base:\n  golden: {w}\n  base:   {g}"
        assert "host-resident" in cols[-1], w
        # each changed run is a host-resident one: the base takes naive there, where the golden says sorted
        runs_changed = set(w.split("\t")[-1].split("; ")) ^ set(g.split("\t")[-1].split("; "))
        assert all("host-resident" in r or "naive" in r for r in runs_changed), (w, g)
    print(
        f"\nthe base's dispatch table differs from the golden in {len(changed)} host-resident rows, e.g.\n  {changed[0][1]}"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-s"]))
