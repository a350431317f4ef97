"""The plants inside vLLM's fused-MoE experts, for the differential kernel tier: copied beside ``plant.py`` into a
build's site-packages as ``moegate_planted_experts.py``, which imports it (standard library only, like it).

The kernel tier calls the experts directly (``fused_experts``; ``TritonExperts.apply`` and
``TritonWNA16Experts.apply``), so a plant it must see acts there, not in the model's forward. Kinds:

- ``moe-reround`` (a loss of accuracy): the router weights the kernel's
  epilogue multiplies by are ``factor`` times too large and the output is divided by ``factor`` again in the
  output's dtype: the same mathematics with one more rounding of every output element, as an epilogue that rounds
  before its last multiplication would (where the router weight scales the input instead, the output is
  multiplied and divided: two roundings of a value already on the grid). A power of two is exact;
- ``topk-order`` (harmless, ``reverse``): in the same entrypoints, each token's top-k ids and weights in reverse
  order, so the sum over a token's experts adds them in another order;
- ``act-fp32`` (harmless, ``silu``): vLLM's ``apply_moe_activation`` for plain silu-and-mul (no clamp, no
  mask) redone in float32 with one rounding at the end, in ``fused_moe`` and ``modular_kernel`` (the legacy and
  the modular experts): an elementwise op at least as accurate as vLLM's, rounded elsewhere;
- ``workspace``: ``fused_experts`` and ``TritonExperts.apply`` allocate ``gib`` GiB of workspace on the weights'
  device on every call, as a pull request that sizes a buffer by a wrong formula would: larger than the GPU, it is
  the build's own out-of-memory error (``moegate.core.faults`` must read it FAIL).

Each patch says what it changed (``plant.py`` prints it) and raises where a name is not where it is expected.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

FUSED_MOE = "vllm.model_executor.layers.fused_moe.fused_moe"
TRITON_MOE = "vllm.model_executor.layers.fused_moe.experts.triton_moe"
MODULAR_KERNEL = "vllm.model_executor.layers.fused_moe.modular_kernel"
MARK = "_moegate_planted"
_INSIDE: list[bool] = []  # non-empty while a planted entrypoint runs (one thread calls the experts)


@contextlib.contextmanager
def _inside() -> Iterator[None]:
    _INSIDE.append(True)
    try:
        yield
    finally:
        _INSIDE.pop()


def _experts_calls(module: Any, change: Callable[[dict[str, Any]], Callable[[Any], Any]], what: str) -> str:
    """Wrap the fused-MoE experts' entrypoints in ``module``: ``change(arguments)`` edits a call's bound arguments
    before it runs and returns what to do with its result (the legacy output, or the modular ``output`` buffer)."""
    if module.__name__ == TRITON_MOE:
        done = []
        for name in ("TritonExperts", "TritonWNA16Experts"):
            cls = getattr(module, name)
            if "apply" not in vars(cls):
                continue
            original = cls.apply
            sig = inspect.signature(original)
            for arg in ("output", "topk_weights", "topk_ids"):
                if arg not in sig.parameters:
                    raise AttributeError(f"{module.__name__}.{name}.apply has no {arg}")

            def apply(self: Any, *args: Any, _o: Any = original, _s: Any = sig, **kwargs: Any) -> Any:
                if _INSIDE:  # a subclass's apply calling its parent's: the change acts once per call
                    return _o(self, *args, **kwargs)
                bound = _s.bind(self, *args, **kwargs)
                after = change(bound.arguments)
                with _inside():
                    result = _o(*bound.args, **bound.kwargs)
                after(bound.arguments["output"])
                return result

            setattr(apply, MARK, True)
            cls.apply = apply
            done.append(f"{name}.apply")
        return f"{', '.join(done)}: {what}"
    original = module.fused_experts
    sig = inspect.signature(original)

    def fused_experts(*args: Any, **kwargs: Any) -> Any:
        if _INSIDE:
            return original(*args, **kwargs)
        bound = sig.bind(*args, **kwargs)
        after = change(bound.arguments)
        with _inside():
            out = original(*bound.args, **bound.kwargs)
        return after(out)

    setattr(fused_experts, MARK, True)
    module.fused_experts = fused_experts
    return f"fused_experts: {what}"


def _in_place(out: Any, value: Any) -> Any:
    out.copy_(value)
    return out


def _moe_reround(module: Any, config: dict[str, Any]) -> str:
    factor = float(config["factor"])

    def change(a: dict[str, Any]) -> Callable[[Any], Any]:
        on_input = bool(a.get("apply_router_weight_on_input", False))
        if not on_input:  # the epilogue multiplies by K * w: the same products, rounded at K times the value
            a["topk_weights"] = a["topk_weights"] * factor

        def after(out: Any) -> Any:
            if on_input:
                _in_place(out, (out.float() * factor).to(out.dtype))
            return _in_place(out, (out.float() / factor).to(out.dtype))

        return after

    return _experts_calls(module, change, f"router weights x {factor} into the kernel, its output / {factor}")


def _topk_reverse(module: Any, config: dict[str, Any]) -> str:
    def change(a: dict[str, Any]) -> Callable[[Any], Any]:
        a["topk_ids"] = a["topk_ids"].flip(1).contiguous()
        a["topk_weights"] = a["topk_weights"].flip(1).contiguous()
        return lambda out: out

    return _experts_calls(module, change, "each token's top-k ids and weights in reverse order")


def _act_fp32(module: Any, config: dict[str, Any]) -> str:
    original = module.apply_moe_activation

    def apply_moe_activation(activation: Any, output: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("activation_config")
        plain = (
            str(getattr(activation, "value", activation)) == "silu"
            and not args
            and kwargs.get("valid_token_counts") is None
            and getattr(config, "clamp_limit", None) is None
            and output.dtype == input.dtype
            and output.element_size() == 2  # 16-bit: float32 outputs round nothing less
        )
        if not plain:
            return original(activation, output, input, *args, **kwargs)
        d = input.shape[-1] // 2
        x = input.float()
        gate = x[..., :d]
        return _in_place(output, (gate * gate.sigmoid() * x[..., d:]).to(output.dtype))

    setattr(apply_moe_activation, MARK, True)
    module.apply_moe_activation = apply_moe_activation
    return "apply_moe_activation: silu-and-mul in float32, one rounding"


def _workspace(module: Any, config: dict[str, Any]) -> str:
    size = float(config["gib"]) * 2**30

    def allocate(a: Any) -> None:
        w1 = a["w1"]
        w1.new_empty((int(size) // w1.element_size(),))  # held for the call, then freed

    if module.__name__ == TRITON_MOE:
        cls = module.TritonExperts
        original = cls.apply
        sig = inspect.signature(original)

        def apply(self: Any, *args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(self, *args, **kwargs)
            allocate(bound.arguments)
            return original(*bound.args, **bound.kwargs)

        setattr(apply, MARK, True)
        cls.apply = apply
        return f"TritonExperts.apply: allocates {config['gib']} GiB of workspace a call"
    original_fn = module.fused_experts
    sig_fn = inspect.signature(original_fn)

    def fused_experts(*args: Any, **kwargs: Any) -> Any:
        bound = sig_fn.bind(*args, **kwargs)
        allocate(bound.arguments)
        return original_fn(*bound.args, **bound.kwargs)

    setattr(fused_experts, MARK, True)
    module.fused_experts = fused_experts
    return f"fused_experts: allocates {config['gib']} GiB of workspace a call"


def patches(config: dict[str, Any]) -> dict[str, dict[str, Callable[[Any], str]]]:
    """``plant.py``'s patches for these kinds, each bound to ``config`` (the build's bug)."""

    def bound(patch: Callable[[Any, dict[str, Any]], str]) -> Callable[[Any], str]:
        return lambda module: patch(module, config)

    return {
        "moe-reround": {FUSED_MOE: bound(_moe_reround), TRITON_MOE: bound(_moe_reround)},
        "topk-order": {FUSED_MOE: bound(_topk_reverse), TRITON_MOE: bound(_topk_reverse)},
        "act-fp32": {FUSED_MOE: bound(_act_fp32), MODULAR_KERNEL: bound(_act_fp32)},
        "workspace": {FUSED_MOE: bound(_workspace), TRITON_MOE: bound(_workspace)},
    }
