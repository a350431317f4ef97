"""A planted bug, copied into a build's site-packages as ``moegate_planted.py`` by ``python -m moegate.builds.planted``.

Self-contained (the standard library only; it is never imported from the checkout): a ``.pth`` line
beside it imports it in every interpreter of the build (API server, engine core, workers), and it
reads its bug from ``moegate_planted.json`` beside it. It hooks the import of the vLLM module that
the bug lives in and patches that module once it has run; a name that is not where it is expected
stops the import with an error (the patch is checked, not assumed), and each patch says on stderr
what it changed, so a server's log shows that its build carries the bug.

Kinds (``moegate.builds.planted.parse_bug`` writes the config; a config may also carry ``version``, the release
the build then reports, as a dev build would: no numerics change):

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
  puts a weight back on the device), so the context does not re-offload it;
- ``naive-scale``: the Qwen3-MoE block's output times ``factor``, but only on calls in the naive region
  (``tokens * top_k * 4 <= experts``: small-batch decode), on every placement: a bug that teacher-forced
  scoring (prefill, hundreds of tokens a call) never reaches;
- ``naive-host-top1``: in the fused-MoE experts (``fused_experts`` and ``TritonExperts.apply``), the top-1
  router weight times ``factor`` on calls in the naive region whose expert weights are host-resident (UVA):
  small-batch decode with offloaded experts, exactly where the change under test acts;
- ``naive-top1``: the same on every placement. Both act inside vLLM's fused-MoE custom op, which a compiled
  model calls as one opaque op and CUDA graphs capture per batch size, so the region is decided per call;
  ``naive-scale`` acts on the model's own forward, which ``torch.compile`` traces (an eager server, or a CPU);
- ``swap-top1``: in the router gate (``GateLinear.forward``, whose logits every placement and device routes by), on
  calls of ``lo`` to ``hi`` tokens (small-batch decode of 2-4 sequences), the first two tokens exchange their top-1
  experts (each keeps its own top logit, moved to the other's expert): a bug of the batch's composition, which a
  batch of one never shows and a step whose size varies from pass to pass shows in one and not the other;
- ``reround`` (harmless, not a bug): the Qwen3-MoE block's output multiplied by ``factor`` and divided by it
  again, each in the model's dtype: the same mathematics with two more roundings, every element moved by at
  most about one unit in the last place, of either sign (a power of two is exact: bit-identical);
- ``reround-attn`` (harmless): the same on the attention block's output (``Qwen3MoeAttention``), as another
  attention kernel rounds differently;
- ``dispatch`` (``ignore-host``): vLLM's residency check (``_weights_host_resident``, in both entrypoint modules)
  answers False, so the naive/sorted choice ignores host-resident weights as 0.32.0's did: a dispatch bug;
- ``workspace`` (an out-of-memory error of the build's own), ``moe-reround`` (a loss of accuracy), ``topk-order``
  and ``act-fp32`` (harmless): inside the fused-MoE experts (``plant_experts.py``, copied beside this file).

Every patched function is a plain Python wrapper without any data-dependent branch: under CUDA-graph
capture the condition on the call's shape is decided once per captured size, as vLLM's own code does.
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

import moegate_planted_experts  # plant_experts.py, copied beside this file: the plants inside the fused-MoE experts

CONFIG: dict[str, Any] = json.loads(Path(__file__).with_suffix(".json").read_text(encoding="utf-8"))
VERSION = "vllm.version"
QWEN3_MOE = "vllm.model_executor.models.qwen3_moe"
FUSED_MOE = "vllm.model_executor.layers.fused_moe.fused_moe"
TRITON_MOE = "vllm.model_executor.layers.fused_moe.experts.triton_moe"
TOPK_ROUTER = "vllm.model_executor.layers.fused_moe.router.fused_topk_router"
GATE_LINEAR = "vllm.model_executor.layers.fused_moe.router.gate_linear"
UVA_OFFLOADER = "vllm.model_executor.offloader.uva"
LOADER_UTILS = "vllm.model_executor.model_loader.utils"
UVA_MARKER = "_vllm_is_uva_offloaded"
HOST_CHECK = "_weights_host_resident"  # 0.33.0's residency check, in fused_moe.py and imported by triton_moe.py
MARK = "_moegate_planted"


def _say(what: str) -> None:
    print(f"moegate planted ({CONFIG.get('spec') or 'relabel'}): {what}", file=sys.stderr, flush=True)


def _relabel(module: Any) -> str:
    """The release the build reports (``vllm.__version__``, the server's ``/version``): a dev build's label."""
    old, module.__version__ = module.__version__, str(CONFIG["version"])
    return f"__version__ {old} reported as {module.__version__}"


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


def _region(top_k: int, experts: int, tokens: int) -> bool:
    """The naive region of the Triton fused MoE: ``tokens * top_k * 4 <= experts`` (small-batch decode)."""
    return tokens * top_k * 4 <= experts


def _naive_scale(module: Any) -> str:
    block = module.Qwen3MoeSparseMoeBlock
    init, forward = block.__init__, block.forward
    factor = float(CONFIG["factor"])
    bind = inspect.signature(init).bind

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        cfg = bind(self, *args, **kwargs).arguments["vllm_config"].model_config.hf_text_config
        self._moegate_region = (int(cfg.num_experts_per_tok), int(cfg.num_experts))

    def planted(self: Any, hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
        out = forward(self, hidden_states, *args, **kwargs)
        tokens = hidden_states.shape[0] if hidden_states.dim() > 1 else 1
        top_k, experts = self._moegate_region
        return out * factor if _region(top_k, experts, tokens) else out

    for fn in (__init__, planted):
        setattr(fn, MARK, True)
    block.__init__, block.forward = __init__, planted
    return f"Qwen3MoeSparseMoeBlock.forward output x {factor} where tokens*top_k*4 <= experts"


def _host_resident(*weights: Any) -> bool:
    return any(getattr(w, UVA_MARKER, False) for w in weights)


def _top1(weights: Any, factor: float) -> Any:
    out = weights.clone()
    out[:, 0] *= factor
    return out


def _scale_top1_in_region(a: Any, factor: float, host: bool) -> None:
    """In a call's bound arguments ``a``: the top-1 router weight x ``factor`` where the call lies in the naive
    region (and, with ``host``, its expert weights are host-resident)."""
    ids = a["topk_ids"]
    experts = int(a.get("global_num_experts") or -1)
    experts = experts if experts > 0 else int(a["w1"].shape[0])
    if (not host or _host_resident(a["w1"], a["w2"])) and _region(ids.shape[1], experts, ids.shape[0]):
        a["topk_weights"] = _top1(a["topk_weights"], factor)


def _naive_host_top1(module: Any) -> str:
    factor = float(CONFIG["factor"])
    host = CONFIG["kind"] == "naive-host-top1"
    where = "host-resident and " if host else ""
    if module.__name__ == TRITON_MOE:
        cls = module.TritonExperts
        original = cls.apply
        sig = inspect.signature(original)
        for name in ("w1", "w2", "topk_weights", "topk_ids"):
            if name not in sig.parameters:
                raise AttributeError(f"{module.__name__}.TritonExperts.apply has no {name}")

        def apply(self: Any, *args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(self, *args, **kwargs)
            _scale_top1_in_region(bound.arguments, factor, host)
            return original(*bound.args, **bound.kwargs)

        setattr(apply, MARK, True)
        cls.apply = apply
        return f"TritonExperts.apply: top-1 weight x {factor} where {where}tokens*top_k*4 <= experts"
    original = module.fused_experts
    if getattr(original, MARK, False):
        return "fused_experts (already planted)"
    sig = inspect.signature(original)

    def fused_experts(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        _scale_top1_in_region(bound.arguments, factor, host)
        return original(*bound.args, **bound.kwargs)

    setattr(fused_experts, MARK, True)
    module.fused_experts = fused_experts
    return f"fused_experts: top-1 weight x {factor} where {where}tokens*top_k*4 <= experts"


def _swapped_top1(logits: Any) -> Any:
    """Router logits with tokens 0 and 1's top-1 experts exchanged: in each of the two rows the entries at the two
    tokens' top-1 experts trade places (no data-dependent branch: where both share their top-1, nothing moves)."""
    out = logits.clone()
    top = logits[:2].argmax(dim=-1)
    for t in (0, 1):
        out[t, top] = logits[t, top.flip(0)]
    return out


def _swap_top1(module: Any) -> str:
    lo, hi = int(CONFIG["lo"]), int(CONFIG["hi"])
    cls = module.GateLinear
    original = cls.forward

    def forward(self: Any, x: Any) -> Any:
        out = original(self, x)
        logits, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
        if lo <= x.shape[0] <= hi:
            logits = _swapped_top1(logits)
        return logits if rest is None else (logits, *rest)

    setattr(forward, MARK, True)
    cls.forward = forward
    return f"GateLinear.forward: tokens 0 and 1 exchange their top-1 experts on calls of {lo}-{hi} tokens"


def _rerounded(cls: Any, factor: float) -> str:
    original = cls.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        # explicit conversions, each a rounding to the model's dtype that a compiler keeps (a fused kernel may
        # otherwise hold the intermediate in float32, and x * K / K would round back to x)
        return ((out.float() * factor).to(out.dtype).float() / factor).to(out.dtype)

    setattr(forward, MARK, True)
    cls.forward = forward
    return f"{cls.__name__}.forward output re-rounded through x {factor} / {factor}"


def _reround(module: Any) -> str:
    return _rerounded(module.Qwen3MoeSparseMoeBlock, float(CONFIG["factor"]))


def _reround_attn(module: Any) -> str:
    return _rerounded(module.Qwen3MoeAttention, float(CONFIG["factor"]))


def _ignore_host(module: Any) -> str:
    """Both entrypoints' modules hold the residency check under this name (the modular one imports it)."""
    getattr(module, HOST_CHECK)  # AttributeError where the release moved it: the import stops, nothing is assumed
    setattr(module, HOST_CHECK, lambda *weights: False)
    return f"{HOST_CHECK} answers False: the naive/sorted choice ignores host-resident weights"


PATCHES: dict[str, dict[str, Callable[[Any], str]]] = {
    "scale": {QWEN3_MOE: _scale},
    "expert": {FUSED_MOE: _expert, TRITON_MOE: _expert},
    "renorm": {TOPK_ROUTER: _renorm},
    "weights": {TOPK_ROUTER: _weights},
    "uva=noop": {UVA_OFFLOADER: _uva_noop},
    "uva=back": {LOADER_UTILS: _uva_back},
    "naive-scale": {QWEN3_MOE: _naive_scale},
    "naive-host-top1": {FUSED_MOE: _naive_host_top1, TRITON_MOE: _naive_host_top1},
    "naive-top1": {FUSED_MOE: _naive_host_top1, TRITON_MOE: _naive_host_top1},
    "swap-top1": {GATE_LINEAR: _swap_top1},
    "reround": {QWEN3_MOE: _reround},
    "reround-attn": {QWEN3_MOE: _reround_attn},
    "dispatch=ignore-host": {FUSED_MOE: _ignore_host, TRITON_MOE: _ignore_host},
    **moegate_planted_experts.patches(CONFIG),
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


def _patches(config: dict[str, Any]) -> dict[str, Callable[[Any], str]]:
    kind = config.get("kind")
    if not kind:
        return {}
    return dict(PATCHES.get(kind) or PATCHES[f"{kind}={config[kind]}"])


_ACTIVE = _patches(CONFIG)
if CONFIG.get("version"):
    _ACTIVE[VERSION] = _relabel
FINDER = _Finder(_ACTIVE)
sys.meta_path.insert(0, FINDER)
