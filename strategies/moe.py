"""Strategies for fused-MoE cases.

The path decision depends only on shapes, placement, expert map and quantization,
so those are drawn to reach every clause of the rule, and the boundary
``tokens * top_k * 4 == experts`` is reached on purpose three ways: a draw that
builds a case on or next to it, ``hypothesis.target`` (``aim_at_boundary``) in the
tests, and pinned ``@example`` cases (``BOUNDARY_EXAMPLES`` / ``pin_boundaries``): the last two in
``moegate.strategies.boundary``.

Fused shared-expert rows (``MoECase.shared_experts``) are drawn as real models
have them, one or two (``SHARED_EXPERT_COUNTS``), and every region and the
boundary are computed over what the entrypoints see: ``top_k + shared`` ids per
token over ``experts + shared`` rows.

Routing is drawn as a recipe (kind, seed, pool) rather than as a tensor: it
changes nothing about the decision, keeps each example cheap to build, and a
shrunk counterexample still names a reproducible routing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st

from moegate.core.activation import Activation
from moegate.core.case import (
    ALL_PLACEMENTS,
    DTYPES,
    QUANT_SCHEMES,
    WNA16_SCHEMES,
    ExpertMap,
    MoECase,
    Placement,
    Quant,
    Routing,
    RoutingKind,
)
from moegate.core.index_width import SIDES, tokens_at_kernel_boundary
from moegate.core.spec import SPARSITY_FACTOR
from moegate.strategies import space

COMMON_EXPERT_COUNTS = (8, 16, 32, 60, 64, 128, 256)
"""Counts real MoE models use (Qwen3-30B-A3B: 128, Qwen3-235B-A22B: 128, DeepSeek-V3: 256)."""

MAX_EXPERTS = space.EXPERTS.hi
MAX_TOKENS = space.MAX_TOKENS

SHARED_EXPERT_COUNTS = (1, 2)
"""Fused shared experts per layer in real models: 1 (DeepSeek-V3, GLM-4.5, Qwen3-Next, MiniMax-M3), 2 (DeepSeek-V2)."""

KERNEL_SHAPES: tuple[tuple[int, int, int], ...] = (
    # (experts, hidden, intermediate). The kernel tier draws shapes from this small
    # fixed set because Triton compiles once per variant (tests/kernels/conftest.py):
    # the cost is compilations, not cases. hidden and intermediate are multiples of
    # 128 so every block size vLLM's default configs pick divides them.
    (128, 2048, 768),  # Qwen3-30B-A3B experts
    (64, 256, 128),
    (16, 128, 256),
    (256, 512, 256),
)

T = TypeVar("T", bound=Callable[..., Any])


def token_counts(lo: int = 1, hi: int = MAX_TOKENS) -> st.SearchStrategy[int]:
    """Decode-sized batches first (1-8), up to well past the naive threshold."""
    hi = max(lo, hi)
    small = st.integers(lo, min(hi, 8))
    return st.one_of(small, st.integers(lo, hi)) if lo <= 8 else st.integers(lo, hi)


def top_ks(hi: int = 8) -> st.SearchStrategy[int]:
    common = [k for k in (1, 2, 4, 6, 8) if k <= hi] or [1]
    return st.one_of(st.sampled_from(common), st.integers(1, max(1, hi)))


def expert_counts(lo: int = 1, hi: int = MAX_EXPERTS) -> st.SearchStrategy[int]:
    """Model-like counts (128 and 256 included) and anything in between."""
    lo = max(1, lo)
    hi = max(lo, hi)
    common = [e for e in COMMON_EXPERT_COUNTS if lo <= e <= hi]
    anything = st.integers(lo, hi)
    return st.one_of(st.sampled_from(common), anything) if common else anything


def hidden_sizes() -> st.SearchStrategy[int]:
    # Multiples of 64 only: vLLM's default BLOCK_SIZE_K is 64 or 128 and its int4
    # packing halves K; odd sizes are a kernel-support question, not a dispatch one.
    return st.sampled_from((64, 128, 256))


def intermediate_sizes() -> st.SearchStrategy[int]:
    return st.sampled_from((64, 128, 256))


def dtypes() -> st.SearchStrategy[str]:
    return st.sampled_from(DTYPES)


def placements() -> st.SearchStrategy[Placement]:
    """All four placements of (w13, w2): device, w13-host, w2-host, both-host."""
    return st.sampled_from(ALL_PLACEMENTS)


def routings() -> st.SearchStrategy[Routing]:
    return st.builds(
        Routing,
        kind=st.sampled_from(list(RoutingKind)),
        seed=st.integers(0, 2**32 - 1),
        pool=st.integers(0, 32),
    )


def expert_maps(num_experts: int) -> st.SearchStrategy[ExpertMap]:
    """Expert parallelism with 2-8 ranks; each rank owns at least one expert."""
    sizes = [n for n in (2, 4, 8) if n <= num_experts] or [1]
    return st.sampled_from(sizes).flatmap(
        lambda n: st.builds(ExpertMap, ep_size=st.just(n), ep_rank=st.integers(0, n - 1))
    )


def quants(group: bool | None = None) -> st.SearchStrategy[Quant]:
    """wNa16 weight-only quantization; ``group``: only grouped / only per-channel / both."""
    sizes = {True: (32, 64, 128), False: (0,), None: (0, 32, 64, 128)}[group]
    return st.builds(Quant, scheme=st.sampled_from(WNA16_SCHEMES), group_size=st.sampled_from(sizes))


def _optional(flag: bool | None, strategy: st.SearchStrategy[T]) -> st.SearchStrategy[T | None]:
    if flag is True:
        return strategy
    if flag is False:
        return st.none()
    return st.one_of(st.none(), strategy)


# moe_cases draws only from these module-level strategies. Building a strategy
# inside a draw (st.integers(lo, hi) with drawn bounds) costs validation on every
# example, which made generation ~10x slower than the vLLM call it feeds; bounded
# values are instead drawn from a fixed range and folded into the bounds, which
# still shrinks towards the lower bound.
_PLACEMENTS = placements()
_TOP_K = top_ks()
_EXPERTS = expert_counts()
_RAW_TOKENS = st.one_of(st.integers(0, 7), st.integers(0, MAX_TOKENS))
_NEAR = st.sampled_from((0, -1, 1))
_ON_BOUNDARY = st.booleans()
_ROUTINGS = routings()
_EP_SIZE = st.sampled_from((2, 4, 8))
_EP_RANK = st.integers(0, 7)
SCHEME_FAMILIES: dict[str | None, tuple[str, ...]] = {
    "wna16": WNA16_SCHEMES,
    "fp8": ("fp8_w8a8",),
    None: QUANT_SCHEMES,
}
"""``moe_cases(schemes=...)``: the weight-only integer schemes, fp8, or any."""
_QUANT_SCHEME = {name: st.sampled_from(schemes) for name, schemes in SCHEME_FAMILIES.items()}
# wNa16: per-channel in both encodings vLLM uses: block_shape [0, 0] and the wNa16 oracle's [0, -1];
# grouped includes the clause's boundary, group size 1 ("block_shape[1] > 0")
_GROUP = {
    True: st.sampled_from(tuple(g for g in space.WNA16_GROUPS if g > 0)),
    False: st.sampled_from(tuple(g for g in space.WNA16_GROUPS if g <= 0)),
    None: st.sampled_from(space.WNA16_GROUPS),
}
# fp8: per-tensor, or the 128 x 128 blocks of DeepSeek-style checkpoints (block_shape[1] = 128 > 0,
# which must not trigger the wNa16 clause)
_FP8_BLOCKS = tuple(g for g in space.FP8_GROUPS if g > 0)
_FP8_GROUP = {True: st.sampled_from(_FP8_BLOCKS), False: st.just(0), None: st.sampled_from(space.FP8_GROUPS)}
_PRESENT = {True: st.just(True), False: st.just(False), None: st.booleans()}
_DTYPES = dtypes()
_DTYPES_16 = st.sampled_from(("bfloat16", "float16"))
_HIDDEN = hidden_sizes()
_INTER = intermediate_sizes()
_KERNEL_SHAPES = st.sampled_from(KERNEL_SHAPES)
_BOOL = st.booleans()
_SHARED = st.sampled_from(SHARED_EXPERT_COUNTS)
# wide shapes (``moe_cases(wide=True)``): the census's ranges, model-like values first
_COMMON_HIDDEN = (64, 128, 256, 2048, 2880, 4096, 7168)
_COMMON_INTER = (64, 96, 176, 192, 352, 704, 768, 1408, 1536, 2048, 2880)
_HIDDEN_WIDE = st.one_of(st.sampled_from(_COMMON_HIDDEN), st.integers(space.HIDDEN.lo, space.HIDDEN.hi))
_INTER_WIDE = st.one_of(st.sampled_from(_COMMON_INTER), st.integers(space.INTERMEDIATE.lo, space.INTERMEDIATE.hi))
_TOP_K_WIDE = st.one_of(_TOP_K, st.integers(space.TOP_K.lo, space.TOP_K.hi))
_ON_INPUT = st.sampled_from(space.ON_INPUT)
_BIAS = st.sampled_from(space.BIAS)


def activations() -> st.SearchStrategy[Activation]:
    """Every activation vLLM's Triton experts accept, with the parameters each takes (``space``)."""
    none = st.none()
    limit = st.sampled_from(space.LIMITS)
    by_name = {
        "silu": st.builds(Activation, name=st.just("silu"), limit=st.one_of(none, limit)),
        "swigluoai_uninterleave": st.builds(
            Activation,
            name=st.just("swigluoai_uninterleave"),
            limit=limit,
            alpha=st.sampled_from(space.SWIGLU_ALPHAS),
            beta=st.sampled_from(space.SWIGLU_BETAS),
        ),
        "situ": st.builds(
            Activation,
            name=st.just("situ"),
            situ_beta=st.sampled_from(space.SITU_BETAS),
            situ_linear_beta=st.sampled_from(space.SITU_LINEAR_BETAS),
        ),
    }
    return st.one_of(*(by_name[n] if n in by_name else st.just(Activation(n)) for n in space.ACTIVATIONS))


_ACTIVATIONS = activations()
_DEFAULT_ACTIVATION = Activation()


def _fold(raw: int, lo: int, hi: int) -> int:
    """Map a drawn non-negative int into [lo, hi]; 0 maps to lo, so shrinking still heads there."""
    return lo + raw % (hi - lo + 1) if hi >= lo else lo


@st.composite
def moe_cases(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    *,
    placement: Placement | st.SearchStrategy[Placement] | None = None,
    region: str | None = None,
    expert_map: bool | None = False,
    quant: bool | None = False,
    group: bool | None = None,
    schemes: str | None = None,
    dtype: str | None = None,
    kernel_shapes: bool = False,
    max_tokens: int = MAX_TOKENS,
    shared: bool | None = False,
    activation: bool | None = False,
    bias: bool | None = False,
    wide: bool = False,
) -> MoECase:
    """A fused-MoE case.

    ``region``: ``"naive"`` (tokens*top_k*4 <= experts), ``"outside"``, or None for
    either, with the boundary drawn on purpose. ``expert_map`` / ``quant``: always,
    never (the default, so each property states what it covers) or None for either.
    ``schemes``: the quantization family (``SCHEME_FAMILIES``); ``group``: grouped
    (block-wise for fp8), per-channel (per-tensor for fp8) or either.
    ``kernel_shapes``: experts/hidden/intermediate from ``KERNEL_SHAPES``.
    ``shared``: fused shared-expert rows always, never (the default) or either;
    the region is then the one over ``top_k + shared`` ids and ``experts + shared`` rows.
    ``activation``: any activation vLLM's Triton experts accept (None; True: never plain silu)
    or plain silu (False, the default). ``bias``: expert biases always, never (the default)
    or either; never with grouped wNa16, whose kernels take none. ``wide``: hidden,
    intermediate and top-k from the census's ranges (``space``) instead of the small
    multiples of 64 the dispatch tier draws by default.
    """
    if isinstance(placement, Placement):
        placement_value = placement
    else:
        placement_value = draw(placement if placement is not None else _PLACEMENTS)

    n_shared = draw(_SHARED) if draw(_PRESENT[shared]) else 0
    top_k = draw(_TOP_K_WIDE if wide else _TOP_K)
    if kernel_shapes:
        num_experts, hidden, inter = draw(_KERNEL_SHAPES)
        top_k = min(top_k, num_experts)
    else:
        hidden, inter = (draw(_HIDDEN_WIDE), draw(_INTER_WIDE)) if wide else (draw(_HIDDEN), draw(_INTER))
        # the naive region needs (experts + shared) >= (top_k + shared) * 4
        lo = (top_k + n_shared) * SPARSITY_FACTOR - n_shared if region == "naive" else top_k
        num_experts = draw(_EXPERTS)
        if num_experts < lo:
            num_experts = _fold(num_experts, lo, MAX_EXPERTS)

    def region_limit() -> int:
        """The largest token count still in the naive region (0: none)."""
        return (num_experts + n_shared) // ((top_k + n_shared) * SPARSITY_FACTOR)

    limit = region_limit()
    raw = draw(_RAW_TOKENS)
    if region == "naive":
        if limit < 1:  # only with kernel_shapes: this shape has no naive region at this top_k
            top_k = 1
            limit = region_limit()
        num_tokens = _fold(raw, 1, max(1, limit))
    elif region == "outside":
        num_tokens = _fold(raw, limit + 1, max(limit + 1, max_tokens, limit + 8))
    elif draw(_ON_BOUNDARY):
        if n_shared and not kernel_shapes and limit >= 1:
            # experts + shared is odd or 2 mod 4 for every model-like count, so the threshold
            # is never met exactly by the token count alone: snap the routed count onto it
            num_experts = limit * (top_k + n_shared) * SPARSITY_FACTOR - n_shared
        num_tokens = max(1, limit + draw(_NEAR))
    else:
        num_tokens = _fold(raw, 1, max_tokens)

    emap = None
    if draw(_PRESENT[expert_map]):
        sizes = [n for n in (2, 4, 8) if n <= num_experts]
        if sizes:
            size = draw(_EP_SIZE)
            size = size if size in sizes else sizes[-1]
            emap = ExpertMap(ep_size=size, ep_rank=draw(_EP_RANK) % size)
    q = None
    if draw(_PRESENT[quant]):
        scheme = draw(_QUANT_SCHEME[schemes])
        q = Quant(scheme=scheme, group_size=draw((_FP8_GROUP if scheme == "fp8_w8a8" else _GROUP)[group]))
    if dtype is None:
        # wNa16 kernels take 16-bit activations only; fp8 models run with 16-bit activations
        dtype = draw(_DTYPES_16 if q is not None else _DTYPES)
    on_input = top_k == 1 and n_shared == 0 and draw(_ON_INPUT)
    act = _DEFAULT_ACTIVATION
    if activation is not False:
        act = draw(_ACTIVATIONS)
        if activation is True and act == _DEFAULT_ACTIVATION:
            act = Activation("gelu")
    grouped_wna16 = q is not None and q.weight_only and q.group_size > 0
    with_bias = draw(_PRESENT[bias]) and not grouped_wna16
    if q is not None and q.scheme == "int4_w4a16":  # two values a byte
        hidden, inter = hidden + hidden % 2, inter + inter % 2
    return MoECase(
        num_tokens=num_tokens,
        top_k=top_k,
        num_experts=num_experts,
        hidden=hidden,
        intermediate=inter,
        dtype=dtype,
        placement=placement_value,
        routing=draw(_ROUTINGS),
        expert_map=emap,
        quant=q,
        apply_router_weight_on_input=on_input,
        shared_experts=n_shared,
        activation=act,
        bias=with_bias,
    )


INDEX_WIDTH_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    # (experts, hidden, intermediate, top_k): wide w13 rows and a narrow hidden size, so a call at the
    # kernel's 32-bit boundary holds little real memory (the boundary is in the intermediate cache)
    (64, 64, 2048, 8),  # 8 ids of 4,096 w13 rows: 65,536 tokens
    (128, 128, 4096, 8),  # 8,192 rows: 32,768 tokens
    (256, 64, 1024, 8),  # with a fused shared expert: 9 ids a token
)


@st.composite
def index_width_cases(
    draw: Callable[[st.SearchStrategy[Any]], Any], *, expert_map: bool | None = False, shared: bool | None = None
) -> MoECase:
    """Cases at the Triton kernel's 32-bit index boundary (``moegate.core.index_width``), on either side.

    The token count is the last whose largest kernel offset fits a signed 32-bit integer, one
    fewer, or one more; shapes from ``INDEX_WIDTH_SHAPES``, any placement and routing seed.
    """
    experts, hidden, inter, top_k = draw(st.sampled_from(INDEX_WIDTH_SHAPES))
    n_shared = draw(_SHARED) if draw(_PRESENT[shared]) else 0
    emap = None
    if draw(_PRESENT[expert_map]):
        size = draw(_EP_SIZE)
        emap = ExpertMap(ep_size=size, ep_rank=draw(_EP_RANK) % size)
    side = draw(st.sampled_from(SIDES))
    tokens = tokens_at_kernel_boundary(top_k + n_shared, max(2 * inter, hidden), side)
    return MoECase(
        num_tokens=tokens,
        top_k=top_k,
        num_experts=experts,
        hidden=hidden,
        intermediate=inter,
        dtype="bfloat16",
        placement=draw(_PLACEMENTS),
        routing=draw(_ROUTINGS),
        expert_map=emap,
        shared_experts=n_shared,
    )
