"""Kernel-tier inputs: weights built once per shape and placement, tokens and routing per case.

Building and pinning a Qwen3-30B-A3B-sized expert set (1.2 GB in bfloat16) takes
seconds; a kernel call takes milliseconds. So the weights of each (experts,
hidden, intermediate, dtype, quantization) are drawn once on the device, copied
once to pinned host memory behind a UVA view, and every case slices them (an
expert map takes its rank's contiguous slice). Only hidden states and routing
are drawn per case, seeded from the case's routing recipe so a failure reproduces.

No vLLM import: the host view comes from the caller (``VllmTarget.host_view``).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from moegate.case import MoECase, Quant
from moegate.tensors import CaseTensors, routing_tensors, scale_shapes, torch_dtype, weight_shapes
from moegate.vllm.names import UVA_MARKER  # a leaf of names: this module imports no vLLM

# standard deviation of (stored value - zero point) for uniformly drawn storage
_Q_STD = {("int8_w8a16", False): 73.6, ("int8_w8a16", True): 73.9, ("int4_w4a16", True): 4.61}

WeightKey = tuple[int, int, int, str, Quant | None]


@dataclass
class WeightSet:
    """One shape's global weights on the device and (lazily) on the host."""

    w1: torch.Tensor
    w2: torch.Tensor
    w1_scale: torch.Tensor | None
    w2_scale: torch.Tensor | None
    host: tuple[torch.Tensor, torch.Tensor] | None = None


def _key(case: MoECase) -> WeightKey:
    return (case.num_experts, case.hidden, case.intermediate, case.dtype, case.quant)


def _draw(case: MoECase, device: torch.device) -> WeightSet:
    """Global weights whose layer output is O(1) (see ``moegate.tensors``), seeded by shape."""
    glob = replace(case, expert_map=None)
    s1, s2 = weight_shapes(glob)
    dtype = torch_dtype(case.dtype)
    seed = zlib.crc32(repr(_key(case)).encode())  # stable across processes, unlike hash()
    gen = torch.Generator(device=device).manual_seed(seed)
    k, n = case.hidden, case.intermediate

    def randn(shape: tuple[int, ...], scale: float) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=device) * scale).to(dtype)

    q = case.quant
    if q is None:
        return WeightSet(randn(s1, 1 / math.sqrt(k)), randn(s2, 1 / math.sqrt(n)), None, None)
    if not q.weight_only:
        w1, sc1 = _fp8_weights(torch.randn(s1, generator=gen, device=device) / math.sqrt(k), q.group_size)
        w2, sc2 = _fp8_weights(torch.randn(s2, generator=gen, device=device) / math.sqrt(n), q.group_size)
        return WeightSet(w1, w2, sc1, sc2)
    grouped = q.group_size > 0
    if grouped:  # unsigned storage with an implicit zero point (int4 packed two per byte)
        w1 = torch.randint(0, 256, s1, generator=gen, device=device, dtype=torch.uint8)
        w2 = torch.randint(0, 256, s2, generator=gen, device=device, dtype=torch.uint8)
    else:  # per-channel int8: signed storage, no zero point
        w1 = torch.randint(-127, 128, s1, generator=gen, device=device, dtype=torch.int8)
        w2 = torch.randint(-127, 128, s2, generator=gen, device=device, dtype=torch.int8)
    sc = scale_shapes(glob)
    assert sc is not None
    qstd = _Q_STD[(q.scheme, grouped)]
    # |N(0,1)|+0.5 has mean ~1.3: scales near 1/(qstd*sqrt(fan_in)) keep outputs O(1)
    w1_scale = (randn(sc[0], 1.0).float().abs() + 0.5).div(1.3 * qstd * math.sqrt(k)).to(dtype)
    w2_scale = (randn(sc[1], 1.0).float().abs() + 0.5).div(1.3 * qstd * math.sqrt(n)).to(dtype)
    return WeightSet(w1, w2, w1_scale, w2_scale)


def _fp8_weights(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float8_e4m3fn weights and float32 scales, as an fp8 checkpoint stores them.

    Per-tensor (``group`` <= 0): one scale per expert. Block-wise: one per
    ``group`` x ``group`` tile (edge tiles partial). Each scale maps its absolute
    maximum onto the largest fp8 value, so the whole fp8 range is used.
    """
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    if group <= 0:
        scale = w.abs().amax(dim=(1, 2)).clamp_min(1e-12) / fp8_max
        full = scale.reshape(-1, 1, 1)
    else:
        e, rows, cols = w.shape
        pr, pc = (-rows) % group, (-cols) % group
        tiles = torch.nn.functional.pad(w, (0, pc, 0, pr)).reshape(
            e, (rows + pr) // group, group, (cols + pc) // group, group
        )
        scale = tiles.abs().amax(dim=(2, 4)).clamp_min(1e-12) / fp8_max
        full = scale.repeat_interleave(group, dim=1).repeat_interleave(group, dim=2)[:, :rows, :cols]
    q = (w / full).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn)
    return q, scale.float().contiguous()


class WeightBank:
    """Cached weights per shape; host copies through ``host_view`` (pinned memory, UVA, marked)."""

    def __init__(self, device: torch.device, host_view: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.device = device
        self.host_view = host_view
        self._sets: dict[WeightKey, WeightSet] = {}

    def weights(self, case: MoECase) -> WeightSet:
        key = _key(case)
        if key not in self._sets:
            self._sets[key] = _draw(case, self.device)
        return self._sets[key]

    def _host(self, ws: WeightSet) -> tuple[torch.Tensor, torch.Tensor]:
        if ws.host is None:
            ws.host = (self.host_view(ws.w1), self.host_view(ws.w2))
        return ws.host

    def inputs(self, case: MoECase, *, seed: int | None = None) -> tuple[CaseTensors, torch.Tensor, torch.Tensor]:
        """Tensors for ``case`` plus w1/w2 placed as ``case.placement`` says (fresh tensor objects)."""
        ws = self.weights(case)
        start, end = (0, case.num_experts) if case.expert_map is None else case.expert_map.local_range(case.num_experts)

        def local(w: torch.Tensor | None) -> torch.Tensor | None:
            return None if w is None else w[start:end]

        def placed(w: torch.Tensor, host_w: torch.Tensor | None) -> torch.Tensor:
            if host_w is None:
                return w[start:end]  # a fresh view object: never carries the marker
            view = host_w[start:end]
            setattr(view, UVA_MARKER, True)  # slicing drops attributes; the layer's parameter keeps it
            return view

        h1 = h2 = None
        if case.placement.host_resident:
            h1, h2 = self._host(ws)
        w1 = placed(ws.w1, h1 if case.placement.w13_host else None)
        w2 = placed(ws.w2, h2 if case.placement.w2_host else None)

        dtype = torch_dtype(case.dtype)
        gen = torch.Generator(device=self.device).manual_seed(case.routing.seed if seed is None else seed)
        hidden = torch.randn((case.num_tokens, case.hidden), generator=gen, device=self.device).to(dtype)
        topk_weights, topk_ids = routing_tensors(case, self.device)
        emap = None
        if case.expert_map is not None:
            emap = torch.tensor(case.expert_map.as_list(case.num_experts), dtype=torch.int32, device=self.device)
        t = CaseTensors(
            hidden,
            ws.w1[start:end],
            ws.w2[start:end],
            topk_weights,
            topk_ids,
            emap,
            local(ws.w1_scale),
            local(ws.w2_scale),
        )
        return t, w1, w2
