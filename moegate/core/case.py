"""The value every tier passes around: one fused-MoE call, described as plain data.

A case holds no tensors. It is hashable, prints as a short reproducer and can be
rebuilt from its JSON form, so a failing example in CI can be pasted back into a
test (``MoECase.from_json``) or into ``python -m moegate repro``.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from enum import Enum
from typing import Any

from moegate.core.activation import Activation

ENTRYPOINTS: tuple[str, ...] = ("legacy", "modular")
"""``legacy``: ``fused_experts`` / ``fused_experts_impl``; ``modular``: ``TritonExperts.apply``."""

DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")


class DispatchPath(str, Enum):
    """How the Triton fused-MoE kernel's blocks are assigned for one call."""

    NAIVE = "naive"  # one block per (token, expert) pair, sorted_token_ids=None
    SORTED = "sorted"  # moe_align_block_size groups each expert's tokens

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Placement:
    """Where each of the two expert weight tensors lives."""

    w13_host: bool = False
    w2_host: bool = False

    @property
    def host_resident(self) -> bool:
        """True when either weight is read from host memory (UVA)."""
        return self.w13_host or self.w2_host

    @property
    def label(self) -> str:
        return {
            (False, False): "device",
            (True, False): "w13-host",
            (False, True): "w2-host",
            (True, True): "both-host",
        }[(self.w13_host, self.w2_host)]

    @classmethod
    def from_label(cls, label: str) -> Placement:
        for p in ALL_PLACEMENTS:
            if p.label == label:
                return p
        raise ValueError(f"unknown placement {label!r}; expected one of {[p.label for p in ALL_PLACEMENTS]}")


ALL_PLACEMENTS: tuple[Placement, ...] = (
    Placement(False, False),
    Placement(True, False),
    Placement(False, True),
    Placement(True, True),
)


@dataclass(frozen=True)
class ExpertMap:
    """Expert parallelism: this rank owns a contiguous slice of the global experts."""

    ep_size: int
    ep_rank: int

    def local_range(self, num_experts: int) -> tuple[int, int]:
        """[start, end) of global expert ids owned by this rank (remainder to the first ranks)."""
        base, extra = divmod(num_experts, self.ep_size)
        start = self.ep_rank * base + min(self.ep_rank, extra)
        return start, start + base + (1 if self.ep_rank < extra else 0)

    def local_count(self, num_experts: int) -> int:
        start, end = self.local_range(num_experts)
        return end - start

    def as_list(self, num_experts: int, shared_experts: int = 0) -> list[int]:
        """Global id -> local id, -1 for experts owned by another rank (vLLM's layout).

        ``num_experts`` counts the routed experts, the ones split between ranks.
        Fused shared-expert rows are not split: every rank holds all of them after
        its own routed rows, so global id ``num_experts + i`` maps to local row
        ``local_count + i`` on every rank, never to -1.
        """
        start, end = self.local_range(num_experts)
        routed = [i - start if start <= i < end else -1 for i in range(num_experts)]
        return routed + [end - start + i for i in range(shared_experts)]


WNA16_SCHEMES: tuple[str, ...] = ("int8_w8a16", "int4_w4a16")
"""Weight-only schemes: 16-bit activations, integer weights (the rule's ``block_shape[1] > 0`` clause)."""

QUANT_SCHEMES: tuple[str, ...] = (*WNA16_SCHEMES, "fp8_w8a8")


@dataclass(frozen=True)
class Quant:
    """Quantized expert weights of the Triton fused MoE.

    wNa16 (int8_w8a16, int4_w4a16): weight-only; ``group_size`` <= 0 is
    per-channel (vLLM passes 0 or -1 in ``block_shape[1]``), > 0 is grouped.
    fp8_w8a8: fp8 weights *and* activations (quantized dynamically inside the
    call); ``group_size`` <= 0 is per-tensor (one weight scale per expert, one
    activation scale per call), > 0 is block-wise (``block_shape=[g, g]``:
    one weight scale per g x g tile, one activation scale per token and g
    columns). fp8 never triggers the wNa16 clause, whatever its block shape.

    ``static_scales`` (fp8 per-tensor only): the activation scales are given rather than
    computed in the call, as 0-D tensors, the way vLLM's FP8 MoE methods reduce a
    checkpoint's per-expert input scales with ``.max()``. False, the default, serializes
    exactly as before the field existed.
    """

    scheme: str
    group_size: int
    static_scales: bool = False

    def __post_init__(self) -> None:
        if self.scheme not in QUANT_SCHEMES:
            raise ValueError(f"unknown quantization scheme {self.scheme!r}; expected one of {QUANT_SCHEMES}")
        if self.static_scales and (self.scheme != "fp8_w8a8" or self.group_size > 0):
            raise ValueError(
                f"static activation scales are fp8_w8a8 per-tensor only, not {self.scheme}/g{self.group_size}"
            )

    @property
    def weight_only(self) -> bool:
        """True for the wNa16 schemes (the ones the dispatch rule names)."""
        return self.scheme in WNA16_SCHEMES


SHARED_EXPERT_WEIGHT = 1.0
"""Router weight of a fused shared-expert slot: its output is added in full, as the separate shared MLP's was.

(vLLM uses ``1 / routed_scaling_factor`` instead when it scales the whole output by that factor afterwards;
the net contribution is the same.)"""


class RoutingKind(str, Enum):
    UNIFORM = "uniform"  # each token: top_k distinct experts, uniformly at random
    SKEWED = "skewed"  # each token's experts from a small shared pool
    ALL_SAME = "all_same"  # every token picks the same top_k experts
    NATURAL = "natural"  # a hot set shared by most tokens plus a random tail


@dataclass(frozen=True)
class Routing:
    """Router output, drawn as a recipe so a case stays small and shrinks well."""

    kind: RoutingKind = RoutingKind.UNIFORM
    seed: int = 0
    pool: int = 0  # SKEWED/NATURAL: size of the shared pool (clamped to [top_k, experts])

    def topk_ids(self, num_tokens: int, top_k: int, num_experts: int) -> list[list[int]]:
        """Distinct expert ids per token, deterministic in the recipe."""
        rng = random.Random(self.seed)
        pool = max(top_k, min(self.pool or top_k, num_experts))
        if self.kind is RoutingKind.ALL_SAME:
            row = rng.sample(range(num_experts), top_k)
            return [list(row) for _ in range(num_tokens)]
        if self.kind is RoutingKind.SKEWED:
            shared = rng.sample(range(num_experts), pool)
            return [rng.sample(shared, top_k) for _ in range(num_tokens)]
        if self.kind is RoutingKind.NATURAL:
            hot = rng.sample(range(num_experts), pool)
            rows = []
            for _ in range(num_tokens):
                n_hot = min(top_k, rng.randint(top_k // 2, top_k))
                row = rng.sample(hot, n_hot)
                rest = [e for e in rng.sample(range(num_experts), min(num_experts, top_k * 2)) if e not in row]
                rows.append((row + rest)[:top_k])
            return rows
        return [rng.sample(range(num_experts), top_k) for _ in range(num_tokens)]

    def topk_weights(self, num_tokens: int, top_k: int, renormalise: bool = True) -> list[list[float]]:
        """Positive router weights summing to one per token (softmax-renormalised top-k), or, without
        ``renormalise``, the scores themselves in (0.05, 1.05) (sigmoid scoring kept as it is: Llama 4)."""
        rng = random.Random(self.seed ^ 0x5EED)
        rows = []
        for _ in range(num_tokens):
            raw = [rng.random() + 0.05 for _ in range(top_k)]
            s = sum(raw) if renormalise else 1.0
            rows.append([r / s for r in raw])
        return rows


@dataclass(frozen=True)
class MoECase:
    """One fused-MoE call: shapes, routing, weight placement and kernel options.

    ``num_experts`` and ``top_k`` describe the routed experts. ``shared_experts``
    > 0 describes a model whose shared experts are fused into the routed ones
    (DeepSeek-V2/V3, GLM-4.5, Qwen3-Next and MiniMax-M3 in vLLM when shared-expert
    fusion is on): their weights are extra rows of w13 and w2 after the routed
    rows, every token is routed to each of them on top of its top-k (global ids
    ``num_experts .. num_experts + shared_experts - 1``, router weight
    ``SHARED_EXPERT_WEIGHT``), and under expert parallelism every rank holds them.
    So an entrypoint sees ``top_k + shared_experts`` ids per token
    (``topk_columns``) over ``num_experts + shared_experts`` experts
    (``total_experts``). 0, the default, is the plain routed layer, and a case
    without shared rows serializes exactly as before the field existed.
    """

    num_tokens: int
    top_k: int
    num_experts: int  # global expert count
    hidden: int = 128  # K
    intermediate: int = 128  # N: w13 is [E, 2N, K], w2 is [E, K, N]
    dtype: str = "bfloat16"
    placement: Placement = Placement()
    routing: Routing = Routing()
    expert_map: ExpertMap | None = None
    quant: Quant | None = None
    apply_router_weight_on_input: bool = False
    shared_experts: int = 0  # fused shared-expert rows appended after the routed ones (see the class docstring)
    activation: Activation = Activation()
    bias: bool = False  # per-expert biases of both products (w13: [E, w13_rows], w2: [E, K])

    def __post_init__(self) -> None:
        problems = []
        if self.num_tokens < 1:
            problems.append(f"num_tokens={self.num_tokens} < 1")
        if not 1 <= self.top_k <= self.num_experts:
            problems.append(f"top_k={self.top_k} not in [1, num_experts={self.num_experts}]")
        if self.dtype not in DTYPES:
            problems.append(f"dtype={self.dtype!r} not in {DTYPES}")
        if self.expert_map is not None and not 0 <= self.expert_map.ep_rank < self.expert_map.ep_size:
            problems.append(f"ep_rank={self.expert_map.ep_rank} not in [0, ep_size={self.expert_map.ep_size})")
        if self.shared_experts < 0:
            problems.append(f"shared_experts={self.shared_experts} < 0")
        if self.apply_router_weight_on_input and self.top_k != 1:
            problems.append("apply_router_weight_on_input needs top_k == 1")
        elif self.apply_router_weight_on_input and self.shared_experts > 0:
            # vLLM scales the input by the router weight only when a token has a single expert id
            problems.append(
                f"apply_router_weight_on_input needs one expert id per token; shared_experts={self.shared_experts} adds more"
            )
        if self.hidden < 1 or self.intermediate < 1:
            problems.append(f"hidden={self.hidden} and intermediate={self.intermediate} must be >= 1")
        if self.quant is not None and self.quant.scheme == "int4_w4a16" and (self.hidden % 2 or self.intermediate % 2):
            problems.append("int4_w4a16 packs two values a byte: hidden and intermediate must be even")
        if self.bias and self.quant is not None and self.quant.weight_only and self.quant.group_size > 0:
            # vLLM's grouped wNa16 kernels take no bias (dispatch_fused_moe_kernel asserts B_bias is None)
            problems.append(f"bias with grouped {self.quant.scheme}: vLLM's grouped wNa16 kernels take no bias")
        if problems:
            raise ValueError("invalid MoECase: " + "; ".join(problems))

    # --- derived facts -------------------------------------------------------

    @property
    def topk_columns(self) -> int:
        """Expert ids per token as the entrypoints receive them (``topk_ids.shape[1]``): routed plus shared."""
        return self.top_k + self.shared_experts

    @property
    def pairs(self) -> int:
        """(token, expert) pairs, shared slots included: the naive path launches one block per pair."""
        return self.num_tokens * self.topk_columns

    @property
    def w13_rows(self) -> int:
        """Rows of each expert's w13: gate and up halves (2N) for a gated activation, N otherwise."""
        return 2 * self.intermediate if self.activation.gated else self.intermediate

    @property
    def total_experts(self) -> int:
        """Every expert id the router can emit: the routed experts, then the fused shared rows."""
        return self.num_experts + self.shared_experts

    @property
    def local_experts(self) -> int:
        """Experts whose weights this rank holds, ``w1.shape[0]``: its routed experts plus every shared row."""
        routed = self.num_experts if self.expert_map is None else self.expert_map.local_count(self.num_experts)
        return routed + self.shared_experts

    def expert_map_list(self) -> list[int] | None:
        """The expert map as vLLM takes it (global id -> local row, -1 remote), shared rows local; None without EP."""
        if self.expert_map is None:
            return None
        return self.expert_map.as_list(self.num_experts, self.shared_experts)

    def topk_ids(self) -> list[list[int]]:
        """Each token's routed ids, then the shared ids in order (vLLM appends them after the routed top-k)."""
        shared = list(range(self.num_experts, self.total_experts))
        return [row + shared for row in self.routing.topk_ids(self.num_tokens, self.top_k, self.num_experts)]

    def topk_weights(self) -> list[list[float]]:
        """The routed weights, then ``SHARED_EXPERT_WEIGHT`` for each shared slot.

        They sum to one, except with ``apply_router_weight_on_input``: the model that weights the input
        (Llama 4) routes top-1 by sigmoid scores it does not renormalise, and a renormalised top-1 weight is
        exactly 1, where weighting the input or the output cannot differ (the reach report's conditions).
        """
        shared = [SHARED_EXPERT_WEIGHT] * self.shared_experts
        renormalise = not self.apply_router_weight_on_input
        return [row + shared for row in self.routing.topk_weights(self.num_tokens, self.top_k, renormalise)]

    # --- reproducers ---------------------------------------------------------

    def short(self) -> str:
        """One line naming what decides the path; used in failure messages and tables."""
        bits = [
            f"placement={self.placement.label}",
            f"tokens={self.num_tokens}",
            f"top_k={self.top_k}",
            f"experts={self.num_experts}",
        ]
        if self.shared_experts:
            bits.append(f"shared={self.shared_experts}")
        if self.expert_map is not None:
            bits.append(f"ep={self.expert_map.ep_rank}/{self.expert_map.ep_size}")
        if self.quant is not None:
            bits.append(
                f"quant={self.quant.scheme}/g{self.quant.group_size}" + ("/static" if self.quant.static_scales else "")
            )
        if self.activation != Activation():
            bits.append(f"activation={self.activation.label}")
        if self.bias:
            bits.append("bias")
        return " ".join(bits)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON; ``shared_experts``, ``activation``, ``bias`` and a quantization's ``static_scales``
        appear only when not the default, so older reproducers stay identical (and an activation lists only the
        parameters it has)."""
        d = dataclasses.asdict(self)
        if d["quant"] is not None and not d["quant"]["static_scales"]:
            del d["quant"]["static_scales"]
        d["routing"]["kind"] = self.routing.kind.value
        if not self.shared_experts:
            del d["shared_experts"]
        if self.activation == Activation():
            del d["activation"]
        else:
            d["activation"] = {k: v for k, v in d["activation"].items() if v is not None}
        if not self.bias:
            del d["bias"]
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoECase:
        d = dict(d)
        d["placement"] = Placement(**d.get("placement", {}))
        r = dict(d.get("routing", {}))
        if "kind" in r:
            r["kind"] = RoutingKind(r["kind"])
        d["routing"] = Routing(**r)
        if d.get("expert_map") is not None:
            d["expert_map"] = ExpertMap(**d["expert_map"])
        if d.get("quant") is not None:
            d["quant"] = Quant(**d["quant"])
        if "activation" in d:
            d["activation"] = Activation(**d["activation"])
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> MoECase:
        return cls.from_dict(json.loads(text))
