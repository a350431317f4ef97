"""One kernel-tier check: run a case through vLLM, compare with the torch reference.

Shared by the kernel tests and the kernel-tier benchmark so the figure the
benchmark reports is the cost of exactly what the tests assert.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from moegate.core.case import MoECase
from moegate.core.tensors import CaseTensors, torch_dtype
from moegate.kernels.inputs import WeightBank
from moegate.kernels.reference import Reference, reference_moe
from moegate.kernels.systematic import Sample, sample_of
from moegate.kernels.tolerance import Closeness, compare, compare_fp8


@dataclass
class KernelResult:
    case: MoECase
    entrypoint: str
    path: str
    output: torch.Tensor
    closeness: Closeness
    systematic: Sample | None = None  # this call's part in the aggregate check (moegate.kernels.systematic)
    tensors: CaseTensors | None = None  # the inputs the call ran on (views of the weight bank's tensors)
    payload: dict[str, Any] | None = None  # what a worker sends back besides its tally (the differential tier's)
    block_k: tuple[int, int] | None = None  # BLOCK_SIZE_K of the w13 and w2 launches (0: not recorded)

    def describe(self) -> str:
        return (
            f"{self.entrypoint} {self.case.short()} dtype={self.case.dtype} path={self.path}: {self.closeness}\n"
            f"  case: {self.case.to_json()}"
        )


def reference_for(
    case: MoECase,
    t: CaseTensors,
    without: frozenset[str] = frozenset(),
    k_blocks: tuple[int, int] | None = None,
) -> Reference:
    """The torch reference of ``case`` on its inputs; ``without`` and ``k_blocks`` as ``reference_moe`` takes them
    (the reach report's conditions: the reference with one of its conditions left out)."""
    return reference_moe(
        t.hidden_states,
        t.w1,
        t.w2,
        t.topk_weights,
        t.topk_ids,
        expert_map=t.expert_map,
        apply_router_weight_on_input=case.apply_router_weight_on_input,
        quant=case.quant,
        w1_scale=t.w1_scale,
        w2_scale=t.w2_scale,
        activation=case.activation,
        w1_bias=t.w1_bias,
        w2_bias=t.w2_bias,
        without=without,
        k_blocks=k_blocks,
        a1_scale=t.a1_scale,
        a2_scale=t.a2_scale,
    )


class StageClock:
    """Seconds per stage of ``run_checked``, summed over calls: the kernel-tier benchmark's profile.

    Each stage ends with a device synchronisation, so a stage's time includes the
    kernels it launched (and nothing of the next stage's). Only the benchmark passes
    a clock; the tests run without the extra synchronisations.
    """

    def __init__(self, sync: Any) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            took = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + took


@contextmanager
def _untimed(name: str) -> Iterator[None]:
    yield


OBSERVERS: list[Callable[[KernelResult], None]] = []
"""Called with every ``run_checked`` result: the kernel tier's session collects the aggregate check's samples."""


def run_checked(
    target: Any, bank: WeightBank, case: MoECase, entrypoint: str, clock: StageClock | None = None
) -> KernelResult:
    """Run ``case`` with the bank's cached weights; the result says the path and the closeness."""
    stage = clock.stage if clock is not None else _untimed
    with stage("inputs"):
        t, w1, w2 = bank.inputs(case)
    with stage("vllm"):
        obs = target.run_placed(case, entrypoint, t, w1, w2)
    with stage("reference"):
        result = _judged(case, entrypoint, t, obs)
    for observe in OBSERVERS:
        observe(result)
    return result


def _judged(case: MoECase, entrypoint: str, t: CaseTensors, obs: Any) -> KernelResult:
    if obs.output is None:
        raise AssertionError(f"{entrypoint} did not complete for {case.short()} (path {obs.path})")
    if case.quant is not None and not case.quant.weight_only:
        assert t.w1_scale is not None and t.w2_scale is not None  # a quantized case's inputs carry its scales
        closeness = compare_fp8(
            obs.output,
            t.hidden_states,
            t.w1,
            t.w2,
            t.topk_weights,
            t.topk_ids,
            case.quant,
            t.w1_scale,
            t.w2_scale,
            obs.quantized,
            expert_map=t.expert_map,
            apply_router_weight_on_input=case.apply_router_weight_on_input,
            activation=case.activation,
            w1_bias=t.w1_bias,
            w2_bias=t.w2_bias,
        )
    else:
        closeness = compare(obs.output, reference_for(case, t), torch_dtype(case.dtype), case.quant, case.activation)
    sample = sample_of(case, entrypoint, t, obs.output)
    blocks = [launch.block_k for launch in getattr(obs, "launches", [])[:2]]  # stand-ins may record none
    block_k = (blocks[0], blocks[1]) if len(blocks) == 2 else None
    return KernelResult(case, entrypoint, obs.path, obs.output, closeness, sample, t, block_k=block_k)
