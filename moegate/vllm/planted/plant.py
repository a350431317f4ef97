"""A planted bug, copied into a build's site-packages as ``moegate_planted.py`` by ``python -m moegate.vllm.planted``.

Self-contained (the standard library only; it is never imported from the checkout): a ``.pth`` line
beside it imports it in every interpreter of the build (API server, engine core, workers), and it
reads its bug from ``moegate_planted.json`` beside it. It hooks the import of the vLLM module that
the bug lives in and patches that module once it has run; a name that is not where it is expected
stops the import with an error (the patch is checked, not assumed), and each patch says on stderr
what it changed, so a server's log shows that its build carries the bug.

Kinds (``moegate.vllm.planted.parse_bug`` writes the config):

- ``scale``: the Qwen3-MoE block's output times ``scale``, on every dispatch path;
- ``expert``: on the sorted path with host-resident (UVA-offloaded) expert weights, the blocks
  assigned to expert ``src`` read expert ``dst``'s weights instead (``expert_ids`` remapped after
  ``_prepare_expert_assignment``, in both entrypoint modules);
- ``renorm``: the router's top-k weights are left as the softmax gave them (``renormalize`` dropped
  in ``fused_topk``) although the model asks for renormalised weights;
- ``weights``: the router's top-k weights times ``weights`` (``fused_topk``'s float32 output): every
  expert's contribution is that much too large in the float32 accumulator, before its rounding. A
  small factor on the rounded bfloat16 output (``scale``) mostly rounds back to the same value
  (1.002 moves only mantissas above 1.95), so this is the systematic error that stays systematic;
- ``uva``: the UVA offload lies. ``noop``: ``UVAOffloader`` offloads nothing and marks nothing,
  whatever the budget (offloading that silently does nothing). ``back``: after each layer's
  ``process_weights_after_loading``, still inside the loader's ``device_loading_context``, every
  marked weight's data is replaced by a device copy while its marker stays (post-processing that
  puts a weight back on the device), so the context does not re-offload it.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONFIG: dict[str, Any] = json.loads(Path(__file__).with_suffix(".json").read_text(encoding="utf-8"))
QWEN3_MOE = "vllm.model_executor.models.qwen3_moe"
FUSED_MOE = "vllm.model_executor.layers.fused_moe.fused_moe"
TRITON_MOE = "vllm.model_executor.layers.fused_moe.experts.triton_moe"
TOPK_ROUTER = "vllm.model_executor.layers.fused_moe.router.fused_topk_router"
UVA_OFFLOADER = "vllm.model_executor.offloader.uva"
LOADER_UTILS = "vllm.model_executor.model_loader.utils"
UVA_MARKER = "_vllm_is_uva_offloaded"
MARK = "_moegate_planted"


def _say(what: str) -> None:
    print(f"moegate planted ({CONFIG['spec']}): {what}", file=sys.stderr, flush=True)


def _scale(module: Any) -> str:
    block = module.Qwen3MoeSparseMoeBlock
    original = block.forward
    factor = float(CONFIG["scale"])

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **kwargs) * factor

    setattr(forward, MARK, True)
    block.forward = forward
    return f"Qwen3MoeSparseMoeBlock.forward output x {factor}"


def _expert(module: Any) -> str:
    original = module._prepare_expert_assignment
    if getattr(original, MARK, False):  # imported by name from the module patched first
        return "_prepare_expert_assignment (already planted)"
    src, dst = int(CONFIG["src"]), int(CONFIG["dst"])
    if "weights_host_resident" not in inspect.signature(original).parameters:
        raise AttributeError(f"{module.__name__}._prepare_expert_assignment has no weights_host_resident")

    def prepare(*args: Any, **kwargs: Any) -> Any:
        sorted_ids, expert_ids, padded = original(*args, **kwargs)
        if sorted_ids is not None and kwargs.get("weights_host_resident", False):
            expert_ids = expert_ids.masked_fill(expert_ids == src, dst)
        return sorted_ids, expert_ids, padded

    setattr(prepare, MARK, True)
    module._prepare_expert_assignment = prepare
    return f"_prepare_expert_assignment: host-resident sorted path reads expert {dst} for {src}"


def _renorm(module: Any) -> str:
    original = module.fused_topk
    signature = inspect.signature(original)
    if "renormalize" not in signature.parameters:
        raise AttributeError(f"{module.__name__}.fused_topk has no renormalize")

    def fused_topk(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.arguments["renormalize"] = False
        return original(*bound.args, **bound.kwargs)

    setattr(fused_topk, MARK, True)
    module.fused_topk = fused_topk
    return "fused_topk: renormalize dropped"


def _weights(module: Any) -> str:
    original = module.fused_topk
    factor = float(CONFIG["weights"])

    def fused_topk(*args: Any, **kwargs: Any) -> Any:
        topk_weights, *rest = original(*args, **kwargs)
        return (topk_weights * factor, *rest)

    setattr(fused_topk, MARK, True)
    module.fused_topk = fused_topk
    return f"fused_topk: top-k weights x {factor}"


def _uva_noop(module: Any) -> str:
    offloader = module.UVAOffloader
    _ = offloader._maybe_offload_to_cpu  # AttributeError (the import stops) where vLLM renamed it

    def keep(self: Any, layer: Any, prefix: str = "") -> Any:
        return layer

    setattr(keep, MARK, True)
    offloader._maybe_offload_to_cpu = keep
    return "UVAOffloader._maybe_offload_to_cpu: offloads nothing, marks nothing"


def _uva_back(module: Any) -> str:
    original = module.device_loading_context

    @contextlib.contextmanager
    def context(layer: Any, target_device: Any) -> Any:
        with original(layer, target_device) as inner:
            try:
                yield inner
            finally:
                for p in layer.parameters():
                    if getattr(p, UVA_MARKER, False) and p.is_cuda:
                        p.data = p.data.clone()  # device memory; the marker stays on the parameter

    setattr(context, MARK, True)
    module.device_loading_context = context
    return "device_loading_context: marked weights copied back to the device after post-processing, still marked"


PATCHES: dict[str, dict[str, Callable[[Any], str]]] = {
    "scale": {QWEN3_MOE: _scale},
    "expert": {FUSED_MOE: _expert, TRITON_MOE: _expert},
    "renorm": {TOPK_ROUTER: _renorm},
    "weights": {TOPK_ROUTER: _weights},
    "uva=noop": {UVA_OFFLOADER: _uva_noop},
    "uva=back": {LOADER_UTILS: _uva_back},
}
"""Patches by bug: its kind, or kind=value where the value picks a different patch."""


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[Any], str]) -> None:
        self.inner, self.patch = inner, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _say(f"{module.__name__}: {self.patch(module)}")


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, patches: dict[str, Callable[[Any], str]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        patch = self.patches.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, patch)
        return spec


FINDER = _Finder(PATCHES.get(CONFIG["kind"]) or PATCHES[f"{CONFIG['kind']}={CONFIG[CONFIG['kind']]}"])
sys.meta_path.insert(0, FINDER)
