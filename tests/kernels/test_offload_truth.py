"""Offload truth on the GPU: after vLLM loads a model with UVA-offloaded experts, every weight is where its marker and the budget say.

The plan's runs with an expectation (``moegate.offload.plan.RUNS``): the unquantized layer (no
offload, every expert weight offloaded, a budget of one w13), block FP8, int8 W8A8 and int4 W4A16 written
pre-quantized by ``moegate.model.quantize``, and the planted offload bugs (``uva=noop``, ``uva=back``)
that must FAIL by the rule they break. Each run is one offline engine in its own process; all start at
once (about 1-3 minutes on an H200). The builds are made from this interpreter; the driver is asked where
each pointer points (``moegate.offload.pointers``), so the check needs CUDA.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from moegate.offload.plan import RUNS, execute, prepare_builds, prepare_models

GATED = [r for r in RUNS if r.expect != "measure"]
TIMEOUT_S = float(os.environ.get("MOEGATE_ENGINE_TIMEOUT", "480"))


@pytest.fixture(scope="module")
def outcomes(cuda_target, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """``cuda_target`` for its skip (no GPU, no UVA); every gated run's result, by name."""
    pytest.importorskip("transformers", reason="building the tiny checkpoint needs transformers")
    work = tmp_path_factory.mktemp("offload-truth")
    models, spec = prepare_models(work, {r.checkpoint for r in GATED})
    builds = prepare_builds(work, sys.executable, (), {r.bug for r in GATED})
    return {r["run"]["name"]: r for r in execute(GATED, models, builds, spec, work / "out", TIMEOUT_S)}


@pytest.mark.parametrize("run", GATED, ids=lambda r: r.name)
def test_each_run_meets_its_expectation(outcomes, run):
    result = outcomes[run.name]
    if result.get("verdict") is None:
        pytest.fail(f"{run.name}: the engine did not complete ({result['error']}); log {result['log']}:\n"
                    f"{result.get('log_tail', '')}", pytrace=False)  # fmt: skip
    findings = "; ".join(f["message"] for f in result["findings"][:4]) or "none"
    assert result["met"], (
        f"{run.name} ({run.why}): expected {run.expect}{' by ' + ', '.join(run.rules) if run.rules else ''}, "
        f"got {result['verdict']} on vLLM {result.get('vllm')}; findings: {findings}"
    )
