"""Kernel-tier inputs: weights built once per shape and placement, tokens and routing per case.

Building and pinning a Qwen3-30B-A3B-sized expert set (1.2 GB in bfloat16) takes
seconds; a kernel call takes milliseconds. So the weights of each (experts,
hidden, intermediate, dtype, quantization) are drawn once on the device, each of
w13 and w2 copied once to pinned host memory behind a UVA view the first time a
case puts it on the host, and every case slices them (an expert map takes its
rank's contiguous slice). Only hidden states and routing are drawn per case,
seeded from the case's routing recipe so a failure reproduces.

The stored numbers are shared where they are the same kind of numbers: every
wNa16 group size of a scheme (and both activation dtypes) reads the same integer
storage with its own scales, and fp8 weights do not depend on the activation
dtype. That halves what a bank holds once a run has met every key (docs/design/kernels.md,
"How many workers"), which is what bounds how many benchmark workers share one GPU
and one host.

Expert biases (cases with ``bias``) are drawn once per shape like the weights and
stay on the device, as vLLM keeps them (the UVA offloader moves the expert weights).
A clamp-limited activation scales every other token's hidden state by
``moegate.kernels.activations.input_gain`` so its clamps bind (``token_gains``: the odd tokens stay
at unit scale, where the SwiGLU-OAI forms' alpha matters), and the biases with the scaled ones.
Static fp8 activation scales (``Quant.static_scales``): ``static_scales``.

No vLLM import: the host view comes from the caller (``VllmTarget.host_view``).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from moegate.core.case import MoECase, Quant
from moegate.core.tensors import CaseTensors, bias_shapes, routing_tensors, scale_shapes, torch_dtype, weight_shapes
from moegate.dispatch.names import UVA_MARKER  # a leaf of names: this module imports no vLLM
from moegate.kernels.activations import input_gain, token_gains

# standard deviation of (stored value - zero point) for uniformly drawn storage
_Q_STD = {("int8_w8a16", False): 73.6, ("int8_w8a16", True): 73.9, ("int4_w4a16", True): 4.61}

WeightKey = tuple[int, int, int, str, Quant | None, bool]
StoredKey = tuple[object, ...]


@dataclass
class Stored:
    """Global w13 and w2 as stored, shared by every key whose numbers they are; host views made on demand."""

    w1: torch.Tensor
    w2: torch.Tensor
    scales: tuple[torch.Tensor, torch.Tensor] | None = None  # fp8: computed from these numbers, so stored with them
    host: list[torch.Tensor | None] = field(default_factory=lambda: [None, None])  # UVA views of w1, w2


@dataclass
class WeightSet:
    """One key's global weights: the stored numbers and this key's scales."""

    stored: Stored
    w1_scale: torch.Tensor | None
    w2_scale: torch.Tensor | None

    @property
    def w1(self) -> torch.Tensor:
        return self.stored.w1

    @property
    def w2(self) -> torch.Tensor:
        return self.stored.w2


def _key(case: MoECase) -> WeightKey:
    """What a key's weights depend on (w1's rows, fused shared ones too); an ungated w13 has half the rows."""
    return (case.total_experts, case.hidden, case.intermediate, case.dtype, case.quant, case.activation.gated)


def _stored_key(case: MoECase) -> StoredKey:
    """What the stored numbers depend on (the module docstring says why the rest is shared)."""
    q = case.quant
    if q is None:
        # unquantized: the key, so the numbers are the ones this key always had (gated keys as before)
        return _key(case)[:5] if case.activation.gated else _key(case)
    shape = (case.total_experts, case.hidden, case.intermediate, q.scheme) + (
        () if case.activation.gated else ("ungated",)
    )
    if not q.weight_only:  # fp8: quantized with the scale granularity, whatever the activation dtype
        return (*shape, max(q.group_size, 0))
    return (*shape, "grouped" if q.group_size > 0 else "per-channel")  # unsigned with a zero point, or signed


def _seed(key: StoredKey) -> int:
    return zlib.crc32(repr(key).encode())  # stable across processes, unlike hash()


def _draw_stored(case: MoECase, device: torch.device) -> Stored:
    """Global weights whose layer output is O(1) (see ``moegate.core.tensors``), seeded by what they depend on."""
    s1, s2 = weight_shapes(replace(case, expert_map=None))
    gen = torch.Generator(device=device).manual_seed(_seed(_stored_key(case)))
    k, n = case.hidden, case.intermediate

    def normal(shape: tuple[int, ...], scale: float) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device).mul_(scale)  # in place: no second float32 copy

    q = case.quant
    if q is None:
        dtype = torch_dtype(case.dtype)
        return Stored(normal(s1, 1 / math.sqrt(k)).to(dtype), normal(s2, 1 / math.sqrt(n)).to(dtype))
    if not q.weight_only:
        w1, sc1 = _fp8_weights(normal(s1, 1 / math.sqrt(k)), q.group_size)
        w2, sc2 = _fp8_weights(normal(s2, 1 / math.sqrt(n)), q.group_size)
        return Stored(w1, w2, (sc1, sc2))
    if q.group_size > 0:  # unsigned storage with an implicit zero point (int4 packed two per byte)
        lo, hi, storage = 0, 256, torch.uint8
    else:  # per-channel int8: signed storage, no zero point
        lo, hi, storage = -127, 128, torch.int8
    return Stored(
        torch.randint(lo, hi, s1, generator=gen, device=device, dtype=storage),
        torch.randint(lo, hi, s2, generator=gen, device=device, dtype=storage),
    )


def _scales(case: MoECase, stored: Stored, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """This key's weight scales: none, fp8's stored ones, or wNa16 scales drawn for this key."""
    q = case.quant
    if q is None:
        return None, None
    if not q.weight_only:
        assert stored.scales is not None  # fp8 numbers are stored with their scales
        return stored.scales
    sc = scale_shapes(replace(case, expert_map=None))
    assert sc is not None
    dtype = torch_dtype(case.dtype)
    gen = torch.Generator(device=device).manual_seed(_seed(_key(case)))
    k, n = case.hidden, case.intermediate
    qstd = _Q_STD[(q.scheme, q.group_size > 0)]

    def scale(shape: tuple[int, ...], fan_in: int) -> torch.Tensor:
        # |N(0,1)|+0.5 has mean ~1.3: scales near 1/(qstd*sqrt(fan_in)) keep outputs O(1)
        drawn = torch.randn(shape, generator=gen, device=device).to(dtype).float()
        return (drawn.abs() + 0.5).div(1.3 * qstd * math.sqrt(fan_in)).to(dtype)

    return scale(sc[0], k), scale(sc[1], n)


def _fp8_weights(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float8_e4m3fn weights and float32 scales, as an fp8 checkpoint stores them.

    Per-tensor (``group`` <= 0): one scale per expert. Block-wise: one per
    ``group`` x ``group`` tile (edge tiles partial). Each scale maps its absolute
    maximum onto the largest fp8 value, so the whole fp8 range is used. The
    scales are broadcast over their tiles, never expanded to ``w``'s size, and
    the absolute maximum is an infinity norm: a float32 expert set is the only
    full-size temporary besides the quotient (the Qwen3-30B-A3B w13 is 1.6 GB).
    """
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    if group <= 0:
        scale = torch.linalg.vector_norm(w, ord=math.inf, dim=(1, 2)).clamp_min(1e-12) / fp8_max
        q = (w / scale.reshape(-1, 1, 1)).clamp_(-fp8_max, fp8_max).to(torch.float8_e4m3fn)
        return q, scale.float().contiguous()
    e, rows, cols = w.shape
    pr, pc = (-rows) % group, (-cols) % group
    padded = torch.nn.functional.pad(w, (0, pc, 0, pr)) if pr or pc else w
    tiles = padded.view(e, (rows + pr) // group, group, (cols + pc) // group, group)
    scale = torch.linalg.vector_norm(tiles, ord=math.inf, dim=(2, 4)).clamp_min(1e-12) / fp8_max
    q = (tiles / scale[:, :, None, :, None]).clamp_(-fp8_max, fp8_max).to(torch.float8_e4m3fn)
    q = q.view(e, rows + pr, cols + pc)[:, :rows, :cols].contiguous()
    return q, scale.float().contiguous()


class WeightBank:
    """Cached weights per key; host copies through ``host_view`` (pinned memory, UVA, marked).

    ``device_bytes`` and ``host_bytes``: what the stored weights hold on the device and
    pinned on the host, for the benchmark's memory figures.
    """

    def __init__(self, device: torch.device, host_view: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.device = device
        self.host_view = host_view
        self._stored: dict[StoredKey, Stored] = {}
        self._sets: dict[WeightKey, WeightSet] = {}
        self._biases: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}
        self.device_bytes = 0
        self.host_bytes = 0

    def weights(self, case: MoECase) -> WeightSet:
        key = _key(case)
        if key not in self._sets:
            skey = _stored_key(case)
            if skey not in self._stored:
                stored = self._stored[skey] = _draw_stored(case, self.device)
                self.device_bytes += sum(_nbytes(t) for t in (stored.w1, stored.w2, *(stored.scales or ())))
            stored = self._stored[skey]
            ws = self._sets[key] = WeightSet(stored, *_scales(case, stored, self.device))
            if stored.scales is None:  # wNa16 scales are this key's own
                self.device_bytes += sum(_nbytes(t) for t in (ws.w1_scale, ws.w2_scale) if t is not None)
            if self.device.type == "cuda":
                # the draw's float32 temporaries would stay reserved by this process;
                # the benchmark runs several processes on one GPU
                torch.cuda.empty_cache()
        return self._sets[key]

    def biases(self, case: MoECase) -> tuple[torch.Tensor, torch.Tensor]:
        """Global w13 and w2 biases for the case's shape, in its dtype, at unit scale.

        Unit scale is the size of both products on the tokens the input gain leaves alone
        (``token_gains``), so there a dropped or misplaced bias moves the output by about as
        much as an expert does; on the scaled tokens of a clamping activation the w13 bias moves
        the clamps' inputs. Biases the size of the scaled products (8 and 64) pushed every
        input of a small clamp past it and swamped the unscaled tokens' tolerance, so that a
        dropped w13 bias or a wrong alpha could not change a result beyond it.
        """
        shapes = bias_shapes(replace(case, expert_map=None))
        assert shapes is not None, "the case has no biases"
        key = (*shapes, case.dtype, 1.0)
        if key not in self._biases:
            gen = torch.Generator(device=self.device).manual_seed(_seed(("bias", *key)))
            dtype = torch_dtype(case.dtype)
            b1 = torch.randn(shapes[0], generator=gen, device=self.device).to(dtype)
            b2 = torch.randn(shapes[1], generator=gen, device=self.device).to(dtype)
            self._biases[key] = (b1, b2)
            self.device_bytes += _nbytes(b1) + _nbytes(b2)
        return self._biases[key]

    def _host(self, stored: Stored, index: int) -> torch.Tensor:
        """The pinned UVA view of w1 (0) or w2 (1), made the first time a case puts that weight on the host."""
        view = stored.host[index]
        if view is None:
            w = (stored.w1, stored.w2)[index]
            view = stored.host[index] = self.host_view(w)
            self.host_bytes += _nbytes(w)
        return view

    def inputs(self, case: MoECase, *, seed: int | None = None) -> tuple[CaseTensors, torch.Tensor, torch.Tensor]:
        """Tensors for ``case`` plus w1/w2 placed as ``case.placement`` says (fresh tensor objects)."""
        if case.shared_experts and case.expert_map is not None:
            raise ValueError(f"the weight bank holds no rank's slice with fused shared rows: {case.short()}")
        ws = self.weights(case)
        start, end = (
            (0, case.total_experts) if case.expert_map is None else case.expert_map.local_range(case.num_experts)
        )

        def local(w: torch.Tensor | None) -> torch.Tensor | None:
            return None if w is None else w[start:end]

        def placed(index: int, host: bool) -> torch.Tensor:
            if not host:
                return (ws.w1, ws.w2)[index][start:end]  # a fresh view object: never carries the marker
            view = self._host(ws.stored, index)[start:end]
            setattr(view, UVA_MARKER, True)  # slicing drops attributes; the layer's parameter keeps it
            return view

        w1 = placed(0, case.placement.w13_host)
        w2 = placed(1, case.placement.w2_host)

        dtype = torch_dtype(case.dtype)
        gen = torch.Generator(device=self.device).manual_seed(case.routing.seed if seed is None else seed)
        hidden = torch.randn((case.num_tokens, case.hidden), generator=gen, device=self.device)
        if input_gain(case.activation) != 1.0:
            gains = torch.tensor(token_gains(case.activation, case.num_tokens), device=self.device)
            hidden = hidden.mul_(gains.unsqueeze(1))
        hidden = hidden.to(dtype)
        topk_weights, topk_ids = routing_tensors(case, self.device)
        b1 = b2 = None
        if case.bias:
            g1, g2 = self.biases(case)
            b1, b2 = local(g1), local(g2)
        a1 = a2 = None
        if case.quant is not None and case.quant.static_scales:
            a1, a2 = static_scales(case, hidden)
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
            b1,
            b2,
            a1,
            a2,
        )
        return t, w1, w2


STATIC_ACTIVATION_AMAX = 16.0
"""What the static activation scale is calibrated for: ``silu(gate) * up`` of the tier's O(1) products stays near
10; a larger value saturates, in the reference too."""


def static_scales(case: MoECase, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """0-D ``a1_scale``, ``a2_scale``: per local expert, the batch's (input) or ``STATIC_ACTIVATION_AMAX``'s
    (activation) absolute maximum over 448 times a factor in [1, 1.25) (the input never saturates), reduced
    with ``.max()`` as vLLM's FP8 MoE methods reduce per-expert input scales."""
    gen = torch.Generator(device=hidden.device).manual_seed(_seed(("static scales", case.routing.seed)))
    factors = 1.0 + 0.25 * torch.rand((2, case.local_experts), generator=gen, device=hidden.device)
    amax = hidden.float().abs().max().clamp_min(1e-12)
    return (amax / 448.0 * factors[0]).max(), (STATIC_ACTIVATION_AMAX / 448.0 * factors[1]).max()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
