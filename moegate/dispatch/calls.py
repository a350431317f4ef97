"""How a case becomes a call of each fused-MoE entrypoint, built as vLLM's own callers build it.

The legacy entrypoint (``fused_experts``) with the quantization config vLLM's MoE
methods pass; the modular one (``TritonExperts.apply``, ``TritonWNA16Experts`` for wNa16
weights) with the experts object vLLM's layer builds and the workspaces it sizes.
``VllmTarget`` (``moegate.dispatch.target``) holds one ``EntrypointCalls`` and runs them
under its recorders.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch

from moegate.core.case import MoECase
from moegate.core.tensors import CaseTensors, torch_dtype
from moegate.dispatch import names


class EntrypointCalls:
    """The two entrypoints' calls for one target: ``fm``/``tm`` are vLLM's fused_moe and triton_moe modules.

    ``finish``: the calls run to the end (per-channel wNa16 then takes the config its plain
    kernel executes); decision-only calls take the one that reaches the decision's clause.
    """

    def __init__(self, fm: Any, tm: Any, device: torch.device, finish: bool) -> None:
        self.fm, self.tm, self.device, self.finish = fm, tm, device, finish
        self._experts_cache: dict[tuple[Any, ...], Any] = {}

    @staticmethod
    def block_shape(case: MoECase) -> list[int] | None:
        """fp8's ``block_shape``: ``[g, g]`` block-wise, None per-tensor."""
        assert case.quant is not None and not case.quant.weight_only
        g = case.quant.group_size
        return [g, g] if g > 0 else None

    def quant_config(self, case: MoECase, t: CaseTensors) -> Any:
        """The quantization config vLLM's MoE methods pass; it carries the experts' biases too."""
        cfg = importlib.import_module(names.FUSED_MOE_CONFIG)
        biases = {"w1_bias": t.w1_bias, "w2_bias": t.w2_bias} if case.bias else {}
        if case.quant is None:
            # an unquantized layer with biases (gpt-oss) passes them in a config of their own
            return getattr(cfg, names.BIASED_QUANT_CONFIG)(**biases) if biases else cfg.FUSED_MOE_UNQUANTIZED_CONFIG
        if not case.quant.weight_only:
            # dynamic activation scales (a1/a2 None): what vLLM's fp8 MoE method passes for
            # checkpoints without static activation scales; static ones (Quant.static_scales): 0-D tensors
            statics = {"a1_scale": t.a1_scale, "a2_scale": t.a2_scale} if case.quant.static_scales else {}
            make_fp8 = cfg.fp8_w8a8_moe_quant_config
            return make_fp8(
                w1_scale=t.w1_scale,
                w2_scale=t.w2_scale,
                block_shape=self.block_shape(case),
                **biases,
                **statics,
                **self.gemm1_activation(case, make_fp8),
            )
        g = case.quant.group_size
        if g > 0 or not self.finish:
            # vLLM's wNa16 oracle passes block_shape=[0, group_size], per-channel as 0 or -1:
            # decision-only calls pass it that way so the `block_shape[1] > 0` clause is reached
            block_shape: list[int] | None = [0, g]
        else:
            # per-channel weights that must run: vLLM's plain Triton kernel takes
            # BLOCK_SIZE_K = min(BLOCK_SIZE_K, *block_shape), so it executes only block_shape=None
            block_shape = None
        make = cfg.int8_w8a16_moe_quant_config if case.quant.scheme == "int8_w8a16" else cfg.int4_w4a16_moe_quant_config
        return make(w1_scale=t.w1_scale, w2_scale=t.w2_scale, block_shape=block_shape, **biases)

    @staticmethod
    def gemm1_activation(case: MoECase, make: Any) -> dict[str, float]:
        """The activation's clamp limit, alpha and beta as vLLM's fp8 MoE methods also put them in the quantization
        config (``gemm1_clamp_limit`` from the layer's swiglu_limit, ``gemm1_alpha``, ``gemm1_beta``), where the
        release's config function takes them; the same values the layer config carries, so nothing numeric changes."""
        given = {"gemm1_clamp_limit": case.activation.limit, "gemm1_alpha": case.activation.alpha,
                 "gemm1_beta": case.activation.beta}  # fmt: skip
        takes = inspect.signature(make).parameters
        return {k: v for k, v in given.items() if v is not None and k in takes}

    def activation(self, case: MoECase) -> Any:
        """vLLM's activation enum member for the case (its name; the parameters travel in the layer config)."""
        return self._activation(case.activation.name)

    def _activation(self, name: str) -> Any:
        return self.fm.MoEActivation.from_str(name) if hasattr(self.fm, "MoEActivation") else name

    def legacy(self, case: MoECase, t: CaseTensors, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        """``fused_experts`` as vLLM's MoE methods call it.

        It takes the activation's name only: vLLM's legacy entrypoint has no way to be handed
        a clamp limit or SiTU's betas, so a parameterised activation reaches it as its plain
        form (the decision, made before the activation runs, is checked all the same; the
        kernel tier draws parameterised activations at the modular entrypoint only).
        """
        activation = self.activation(case)
        return self.fm.fused_experts(
            t.hidden_states,
            w1,
            w2,
            t.topk_weights,
            t.topk_ids,
            activation=activation,
            apply_router_weight_on_input=case.apply_router_weight_on_input,
            global_num_experts=case.total_experts,  # see modular: the shared rows are counted
            expert_map=t.expert_map,
            quant_config=self.quant_config(case, t),
        )

    def experts(self, case: MoECase, t: CaseTensors) -> Any:
        """A TritonExperts (TritonWNA16Experts for wNa16 weights), built as vLLM's layer builds it.

        With fused shared experts vLLM's layer keeps the routed counts in the config
        (``num_experts``, ``experts_per_token``) and counts the shared rows only among
        the local experts; so does this.

        An ungated activation (``*_no_mul``) is in the config only where the call runs to the
        end: vLLM refuses to build such a config on a platform other than CUDA, ROCm or XPU
        (its own check), so a decision-only call on a CPU builds it gated and hands the
        ungated activation to ``apply``, which sizes the buffers from it; the decision reads
        neither.
        """
        cfgmod = importlib.import_module(names.FUSED_MOE_CONFIG)
        key = (
            case.num_experts,
            case.local_experts,
            case.top_k,
            case.hidden,
            case.intermediate,
            case.dtype,
            case.quant,
            case.activation,
        )
        cacheable = case.quant is None and not case.bias  # a bias tensor is the case's own
        if cacheable and key in self._experts_cache:
            return self._experts_cache[key]
        fields = {f for f in cfgmod.FusedMoEConfig.__dataclass_fields__}
        kwargs: dict[str, Any] = {
            "num_experts": case.num_experts,
            "experts_per_token": case.top_k,
            "hidden_dim": case.hidden,
            "num_local_experts": case.local_experts,
            "moe_parallel_config": cfgmod.FusedMoEParallelConfig.make_no_parallel(),
            "activation": self.activation(case) if case.activation.gated or self.finish else self._activation("silu"),
            "in_dtype": torch_dtype(case.dtype),
            "device": self.device,
            "routing_method": cfgmod.RoutingMethodType.TopK,
        }
        # the intermediate size's field name changed across releases
        inter_field = "intermediate_size" if "intermediate_size" in fields else "intermediate_size_per_partition"
        kwargs[inter_field] = case.intermediate
        if "num_logical_experts" in fields:
            kwargs["num_logical_experts"] = case.num_experts
        if "max_num_tokens" in fields:
            kwargs["max_num_tokens"] = 512
        if "has_bias" in fields:
            kwargs["has_bias"] = case.bias
        act = case.activation
        for field, given in (
            ("swiglu_limit", act.limit),
            ("swiglu_alpha", act.alpha),
            ("swiglu_beta", act.beta),
            ("activation_situ_beta", act.situ_beta),
            ("activation_situ_linear_beta", act.situ_linear_beta),
        ):
            if given is not None:
                if field not in fields:
                    raise TypeError(f"this vLLM's FusedMoEConfig has no {field}: it cannot run {act.label}")
                kwargs[field] = given
        moe_config = cfgmod.FusedMoEConfig(**kwargs)
        wna16 = case.quant is not None and case.quant.weight_only
        cls = getattr(self.tm, names.TRITON_WNA16_EXPERTS if wna16 else names.TRITON_EXPERTS)
        experts = cls(moe_config, self.quant_config(case, t))
        if cacheable:
            self._experts_cache[key] = experts
        return experts

    def modular(self, case: MoECase, t: CaseTensors, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        """``TritonExperts.apply`` as vLLM's modular kernel calls it.

        The global count passed is ``modular_global_count``'s. The legacy entrypoint counts what it
        is passed, so there the shared rows must be in the count for their ids to be valid to the alignment.
        """
        experts = self.experts(case, t)
        activation = self.activation(case)
        global_count = modular_global_count(case)
        m, k, n = case.num_tokens, case.hidden, case.w13_rows  # N is w1.shape[1]
        ws13_shape, ws2_shape, out_shape = experts.workspace_shapes(
            m, n, k, case.topk_columns, global_count, case.local_experts, None, activation
        )
        dtype = torch_dtype(case.dtype)
        dev = t.hidden_states.device
        workspace13 = torch.empty(ws13_shape, dtype=dtype, device=dev)
        workspace2 = torch.empty(ws2_shape, dtype=dtype, device=dev)
        output = torch.zeros(out_shape, dtype=dtype, device=dev)
        hidden, a1q_scale = t.hidden_states, None
        if case.apply_router_weight_on_input:
            # the modular kernel's prepare step weights the input (top-1) before it quantizes and dispatches it:
            # TritonExperts.apply multiplies by the router weight in neither GEMM when it is applied on the input
            # (vLLM 0.33.0, modular_kernel.py's prepare contract). Calling apply directly, the adapter is that step.
            hidden = hidden * t.topk_weights.to(hidden.dtype)
        if case.quant is not None and not case.quant.weight_only:
            # the modular kernel's prepare step quantizes the input before the experts run
            # with the layer's static input scale where it has one (the quant config's a1_scale)
            hidden, a1q_scale = getattr(self.tm, names.QUANTIZE_INPUT)(
                hidden, t.a1_scale, self.fp8_dtype(), False, self.block_shape(case)
            )
        experts.apply(
            output,
            hidden,
            w1,
            w2,
            t.topk_weights,
            t.topk_ids,
            activation,
            global_count,
            t.expert_map,
            a1q_scale,
            t.a2_scale,  # the modular kernel passes the experts' a2_scale (the quant config's): None unless static
            workspace13,
            workspace2,
            None,
            case.apply_router_weight_on_input,
        )
        return output

    def fp8_dtype(self) -> torch.dtype:
        from vllm.platforms import current_platform

        return current_platform.fp8_dtype()


def modular_global_count(case: MoECase) -> int:
    """Without an expert map, the routed count, as vLLM's layer passes it (fused shared rows are not in
    ``layer.global_num_experts``: vLLM #51632); with one, the whole id space, the map's length."""
    return case.num_experts if case.expert_map is None else case.total_experts
