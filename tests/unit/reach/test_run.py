"""The reach run's configuration: coverage.py's source and what it leaves untraced, the tiers, the record's name."""

from __future__ import annotations

import pytest

from moegate.reach import layout, run
from tests.support.reach import fake_vllm


def test_coverage_traces_the_measured_folders_and_leaves_the_rest_of_vllm_out(tmp_path):
    root = fake_vllm(tmp_path)
    for extra in ("v1/engine", "model_executor/models", "entrypoints"):
        (root / extra).mkdir(parents=True)
        (root / extra / "x.py").write_text("")
    rc = run.rcfile(layout.read(root), tmp_path / ".coverage")
    assert f"source = {root.resolve()}" in rc and "branch = True" in rc
    omitted = run.omitted(layout.read(root))
    assert f"{root.resolve()}/v1/*" in omitted and f"{root.resolve()}/model_executor/models/*" in omitted
    assert not any(p.startswith(f"{root.resolve()}/model_executor/layers") for p in omitted)


def test_tiers_are_known_and_kept_in_order():
    assert run.parse_tiers("kernels, dispatch") == ["dispatch", "kernels"]
    with pytest.raises(run.ReachError, match="known tiers are dispatch, kernels"):
        run.parse_tiers("dispatch,e2e")


def test_a_record_is_named_by_its_tiers_device_and_release():
    assert run.label(["dispatch"], "cpu (x86_64)", "0.33.0") == "dispatch-cpu-0.33.0"
    assert run.label(["dispatch", "kernels"], "NVIDIA H200", "0.33.0") == "dispatch+kernels-nvidia-h200-0.33.0"
