"""The plants the differential kernel tier's GPU run puts into vLLM (``plant_experts.py``) find every name they
patch in the installed vLLM, at both entrypoints: a plant whose name moved would stop a build's import, and the tier
would read a harmless change as a PR that cannot run. Patched here in this process, then put back."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from moegate.builds.planted import parse_bug
from tests.support.plants import experts_plants

MODULAR_KERNEL = "vllm.model_executor.layers.fused_moe.modular_kernel"


@pytest.mark.parametrize("bug", ["moe-reround=3", "topk-order=reverse", "act-fp32=silu"])
def test_each_experts_plant_patches_the_installed_vllms_entrypoints(target, monkeypatch, bug):
    config = parse_bug(bug)
    patches = experts_plants().patches(config)[config["kind"]]
    modules = {target.fm.__name__: target.fm, target.tm.__name__: target.tm}
    if MODULAR_KERNEL in patches:
        modules[MODULAR_KERNEL] = importlib.import_module(MODULAR_KERNEL)
    for name, patch in patches.items():
        module = modules[name]
        for owner, attr in ((module, "fused_experts"), (module, "apply_moe_activation")):
            if hasattr(owner, attr):
                monkeypatch.setattr(owner, attr, getattr(owner, attr))  # put back after the test
        for cls in ("TritonExperts", "TritonWNA16Experts"):
            if hasattr(module, cls):
                monkeypatch.setattr(getattr(module, cls), "apply", vars(getattr(module, cls))["apply"])
        said = patch(module)
        assert said and "(already planted)" not in said
    planted = {
        "moe-reround": [target.fm.fused_experts, target.tm.TritonExperts.apply, target.tm.TritonWNA16Experts.apply],
        "topk-order": [target.fm.fused_experts, target.tm.TritonExperts.apply, target.tm.TritonWNA16Experts.apply],
        "act-fp32": [target.fm.apply_moe_activation, importlib.import_module(MODULAR_KERNEL).apply_moe_activation],
    }[config["kind"]]
    assert all(getattr(f, "_moegate_planted", False) for f in planted)
