"""The e2e tier's decode-path data reaches the naive region, on both e2e models (issue 29 item 2).

The e2e tier scores the log-probabilities each build decoded along the common prefix of the two builds'
greedy passes at 1 and at 4 in flight (``moegate/e2e/run_data.py`` ``decode_pairs``; the rules in
``moegate/e2e/rules/``). This test traces, as ``test_layer_lifecycle.py`` does, every fused-MoE call of
vLLM's offline engine serving each e2e model with its experts UVA-offloaded (as the e2e servers on a
GPU run; resident too with ``MOEGATE_E2E_REGION_SCENARIOS=uva-all,device``), one prompt at a time and four at once (``moegate.model.engine``: ``single`` and
``batch``), and asserts that

- every decode step of the one-at-a-time pass (1 token) lies in the naive region ``T * top_k * 4 <= E``,
  with the placement the scenario gives: host-resident under UVA, where the change under test acts;
- the four-at-once pass has decode steps of 4 tokens, in the region too (``4 * 8 * 4 = 128`` experts of
  the random model; ``4 * 4 * 4 = 64`` of the trained one), so both in-flight counts the e2e passes use
  put their decoded log-probabilities on that path;
- the traced calls took the path the executable spec requires (sorted for host-resident weights on
  0.33.0), so the trace is of the layer the e2e servers run, not of a stand-in.

The engine runs eagerly so the recorders see every call; the e2e servers capture CUDA graphs, whose
replay runs the same shapes through the same dispatch decision (``test_cuda_graphs.py``).

    MOEGATE_REQUIRE_CUDA=1 python -m pytest tests/kernels/test_e2e_decode_region.py   # the lead, on the GPU: 2-3 min
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from moegate.core.case import MoECase, Placement
from moegate.core.spec import expected_path, in_naive_region
from moegate.model.tiny_spec import TinyMoESpec
from tests.support import ROOT

TIMEOUT_S = int(os.environ.get("MOEGATE_ENGINE_TIMEOUT", "480"))
MAX_TOKENS = 12
MODELS = ("random", "trained")
SCENARIOS = tuple(os.environ.get("MOEGATE_E2E_REGION_SCENARIOS", "uva-all").split(","))
"""UVA-offloaded experts, as the e2e servers run on a GPU (``uva-all,device`` adds resident experts: a minute more)."""


@pytest.fixture(scope="session")
def e2e_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The random e2e preset (no tokenizer needed: the engine takes token ids) and the committed trained model."""
    pytest.importorskip("transformers", reason="building the random e2e checkpoint needs transformers")
    from moegate.model.tiny_model import build

    random = build(tmp_path_factory.mktemp("e2e-random") / "model", preset="e2e")
    return {"random": random, "trained": ROOT / "models" / "e2e-trained"}


@pytest.fixture(scope="session")
def report(cuda_target, e2e_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e-region")
    cache: dict[tuple[str, str], dict[str, Any]] = {}

    def run(model: str, scenario: str) -> dict[str, Any]:
        key = (model, scenario)
        if key not in cache:
            path = out / f"{model}-{scenario}.json"
            cmd = [sys.executable, "-m", "moegate.model.engine", "--model", str(e2e_models[model]),
                   "--scenario", scenario, "--json", str(path), "--max-tokens", str(MAX_TOKENS)]  # fmt: skip
            proc = subprocess.run(
                cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=dict(os.environ)
            )
            if proc.returncode != 0 or not path.is_file():
                tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
                pytest.fail(f"{model}/{scenario}: `{' '.join(cmd)}` exit {proc.returncode}:\n{tail}", pytrace=False)
            cache[key] = json.loads(path.read_text())
        return cache[key]

    return run


def _case(call: dict[str, Any], spec: TinyMoESpec) -> MoECase:
    return MoECase(
        num_tokens=call["tokens"], top_k=call["top_k"], num_experts=call["experts"], hidden=spec.hidden,
        intermediate=spec.moe_intermediate, placement=Placement(w13_host=call["w13_host"], w2_host=call["w2_host"]),
    )  # fmt: skip


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("model", MODELS)
def test_the_decode_steps_the_e2e_tier_scores_lie_in_the_naive_region(report, e2e_models, model, scenario):
    spec = TinyMoESpec.from_model_dir(e2e_models[model])
    rep = report(model, scenario)
    host = scenario != "device"
    for mode, width in (("single", 1), ("batch", 4)):
        calls = rep["runs"][mode]["calls"]
        assert calls, f"{model}/{scenario}/{mode}: no fused-MoE call traced"
        decode = [c for c in calls if c["tokens"] <= width]
        steps = {c["tokens"] for c in decode}
        assert width in steps, f"{model}/{scenario}/{mode}: no decode step of {width} tokens traced ({sorted(steps)})"
        outside, wrong_path, placed = [], [], []
        for c in decode:
            case = _case(c, spec)
            if not in_naive_region(case, "modular"):
                outside.append(f"tokens={c['tokens']} top_k={c['top_k']} experts={c['experts']}")
            if case.placement.host_resident != host:
                placed.append(case.placement.label)
            want = expected_path(case, "modular").path.value
            if c["path"] != want:
                wrong_path.append(f"tokens={c['tokens']} took {c['path']}, spec requires {want}")
        assert not outside, f"{model}/{scenario}/{mode}: decode calls outside the naive region: {outside[:3]}"
        assert not placed, f"{model}/{scenario}/{mode}: decode calls placed {placed[:3]}, the scenario says host={host}"
        assert not wrong_path, f"{model}/{scenario}/{mode} on vLLM {rep['vllm']}: {wrong_path[:3]}"
        # every generated token after the first came from such a step, in every layer
        prompts = len(rep["prompts"])
        least = (MAX_TOKENS - 1) * spec.layers * (prompts if width == 1 else 1)
        assert len(decode) >= least, f"{model}/{scenario}/{mode}: {len(decode)} decode calls, want >= {least}"
