"""Cases the GPU kernel tier can run, built valid by construction.

Shapes, token counts, placements, routings and expert maps come from the same
``moe_cases`` as the dispatch tier, with ``kernel_shapes=True``: (experts,
hidden, intermediate) from ``KERNEL_SHAPES``, multiples of 128, so every
BLOCK_SIZE_K vLLM's configs pick divides them, and so does every wNa16 group
size drawn here. The dtype and the quantization are drawn here, after the case's
shape, entrypoint and expert map are known, from only what vLLM's kernels
support; nothing is mapped or filtered afterwards. The constraints, each as the
draw builds it in:

- the Qwen3-30B-A3B shape (128 experts, hidden 2048) draws bfloat16 only: a
  float32 copy would pin 2.4 GB of host memory for no dispatch-relevant
  difference. Other shapes draw any dtype; quantized weights take 16-bit
  activations (as in ``moe_cases``).
- wNa16 group sizes are 32, 64 or 128: smaller ones (the dispatch tier draws
  group size 1, the boundary of the ``block_shape[1] > 0`` clause) are not a
  layout vLLM's wNa16 kernels are tuned or tested for.
- wNa16 per-channel (group size 0 or -1) only for int8_w8a16 at the legacy
  entrypoint. The legacy entrypoint sends ungrouped wNa16 weights to the plain
  Triton kernel, which has an int8_w8a16 branch only (int4 is served by the
  grouped GPTQ/AWQ kernels); at the modular entrypoint ``TritonWNA16Experts``
  launches the grouped kernel, which asserts ``block_shape`` is given.
- fp8 is per-tensor or block-wise with blocks of 128, 64 or 32 (``FP8_BLOCKS``: the block shapes vLLM ships
  tuned configs for).
- fp8 per-tensor is not drawn with an expert map at the legacy entrypoint (the
  block-wise fp8, whose scales are per token, is):
  ``fused_experts_impl`` drops remote experts' pairs at alignment
  (``ignore_invalid_experts=True``), so their rows of the intermediate cache are
  never written, yet the second product's dynamic per-tensor activation scale is
  taken over every row, unwritten ones included: the output depends on stale
  memory (``lab/gpu/probes/fp8_ep_stale_memory.py`` shows it). The modular experts
  avoid it (``a2_scale_is_global`` keeps those pairs). A numerics question of the
  legacy API, not of dispatch.
- int4_w4a16 with group size 32 is not drawn at the Qwen3-30B-A3B shape at the
  legacy entrypoint. There, at decode batches, ``fused_experts`` sends int4 to
  vLLM's CUDA wNa16 kernel, whose block heuristic grows BLOCK_SIZE_K to 512 for
  the first product (hidden 2048), and the kernel accepts only BLOCK_SIZE_K /
  group_size in 1, 2, 4, 8: the call raises (``moe_wna16_gemm ... BLOCK_SIZE_K //
  group_size must be one of [1, 2, 4, 8]``) in 0.32.0 and 0.33.0 alike, the first
  time at 1 token and top-3. The modular ``TritonWNA16Experts`` always launch the
  Triton wNa16 kernel and run it. Found by the kernel-tier benchmark on an H200;
  ``lab/gpu/probes/wna16_block_k.py`` lists every draw it hits and runs the
  smallest, and ``tests/dispatch/test_kernel_configs.py`` asks vLLM's heuristic
  that no legacy draw reaches it. A crash of vLLM's quantized kernels on every
  build, not a dispatch question, so the tier leaves it to the probe rather than
  fail every pull request on it.
- fp8 needs a GPU with fp8 tensor cores (compute capability 8.9+); callers pass
  ``schemes="wna16"`` elsewhere (``tests/support/kernels.py``: ``QUANT_FAMILY``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache
from typing import Any

from hypothesis import strategies as st

from moegate.core.activation import ACTIVATIONS, PARAMETERS, Activation
from moegate.core.case import (
    ALL_PLACEMENTS,
    DTYPES,
    ENTRYPOINTS,
    MoECase,
    Placement,
    Quant,
)
from moegate.strategies import space
from moegate.strategies.moe import SCHEME_FAMILIES, moe_cases, routings
from moegate.strategies.moe import activations as moe_activations

MAX_KERNEL_TOKENS = 16
"""Decode-sized batches and just past the naive threshold; Triton compiles per token bucket."""

BIG_SHAPE = (128, 2048, 768)
"""Qwen3-30B-A3B's experts: drawn in bfloat16 only."""

WNA16_GROUP_SIZES = (32, 64, 128)
PER_CHANNEL = (0, -1)
"""Both encodings of per-channel wNa16 vLLM uses: ``block_shape`` [0, 0] and the wNa16 oracle's [0, -1]."""
FP8_PER_TENSOR, FP8_BLOCK = 0, 128
FP8_BLOCKS = (FP8_BLOCK, 64, 32)
"""fp8 block-wise g x g: vLLM ships tuned configs for 128 x 128 and for 64 x 64 and 32 x 32 (golden/census/), each a
variant of the Triton kernel (``group_k``) the reach report requires."""
INT4_GROUP_TOO_SMALL_AT_BIG_SHAPE = 32
"""At the legacy entrypoint vLLM's CUDA wNa16 kernel rejects the block its own heuristic picks there (the module docstring)."""


def group_sizes(scheme: str, entrypoint: str, expert_map: bool, shape: tuple[int, int, int]) -> tuple[int, ...]:
    """The group sizes vLLM's GPU kernels run for ``scheme`` at ``entrypoint`` (the module docstring's rules).

    ``shape``: the case's (experts, hidden, intermediate).
    """
    if scheme == "fp8_w8a8":
        return FP8_BLOCKS if expert_map and entrypoint == "legacy" else (FP8_PER_TENSOR, *FP8_BLOCKS)
    per_channel = PER_CHANNEL if scheme == "int8_w8a16" and entrypoint == "legacy" else ()
    grouped: tuple[int, ...] = WNA16_GROUP_SIZES
    if scheme == "int4_w4a16" and shape == BIG_SHAPE and entrypoint == "legacy":
        grouped = tuple(g for g in grouped if g != INT4_GROUP_TOO_SMALL_AT_BIG_SHAPE)
    return (*per_channel, *grouped)


_PRESENT = {True: st.just(True), False: st.just(False), None: st.booleans()}
_BF16 = st.just("bfloat16")
_DTYPES = st.sampled_from(DTYPES)
_DTYPES_16 = st.sampled_from(("bfloat16", "float16"))


@cache
def _groups(scheme: str, entrypoint: str, expert_map: bool, shape: tuple[int, int, int]) -> st.SearchStrategy[int]:
    return st.sampled_from(group_sizes(scheme, entrypoint, expert_map, shape))


@cache
def _schemes(schemes: str | None) -> st.SearchStrategy[str]:
    if schemes not in SCHEME_FAMILIES:
        raise ValueError(f"unknown scheme family {schemes!r}; expected one of {list(SCHEME_FAMILIES)}")
    return st.sampled_from(SCHEME_FAMILIES[schemes])


@st.composite
def _supported(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    base: st.SearchStrategy[MoECase],
    entrypoint: str,
    quant: bool | None,
    schemes: str | None,
) -> MoECase:
    case = draw(base)
    shape = (case.num_experts, case.hidden, case.intermediate)
    q = None
    if draw(_PRESENT[quant]):
        scheme = draw(_schemes(schemes))
        q = Quant(scheme=scheme, group_size=draw(_groups(scheme, entrypoint, case.expert_map is not None, shape)))
    if shape == BIG_SHAPE:
        dtype = draw(_BF16)
    else:
        dtype = draw(_DTYPES_16 if q is not None else _DTYPES)
    return dataclasses.replace(case, dtype=dtype, quant=q)


def kernel_cases(
    entrypoint: str,
    *,
    placement: Placement | st.SearchStrategy[Placement] | None = None,
    region: str | None = None,
    expert_map: bool | None = None,
    quant: bool | None = False,
    schemes: str | None = None,
    max_tokens: int = MAX_KERNEL_TOKENS,
) -> st.SearchStrategy[MoECase]:
    """Cases ``entrypoint`` runs on a GPU (see the module docstring).

    ``placement``, ``region``, ``expert_map``: as ``moe_cases``. ``quant``: always,
    never (the default) or either; ``schemes``: the quantization family
    (``moegate.strategies.moe.SCHEME_FAMILIES``: ``"wna16"``, ``"fp8"`` or None for any).
    """
    if entrypoint not in ENTRYPOINTS:
        raise ValueError(f"unknown entrypoint {entrypoint!r}; expected one of {ENTRYPOINTS}")
    _schemes(schemes)  # an unknown family fails here, not at the first draw
    base = moe_cases(
        placement=placement,
        region=region,
        expert_map=expert_map,
        quant=False,
        dtype="bfloat16",  # drawn again in _supported, once the shape and the quantization are known
        kernel_shapes=True,
        max_tokens=max_tokens,
    )
    return _supported(base, entrypoint, quant, schemes)


CENSUS_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    # (experts, hidden, intermediate, top_k) of a real model at a tensor-parallel split the census finds,
    # K and N both off the multiples of 128 (golden/census/: shape lines; the dispatch tier draws the rest)
    (128, 2880, 720, 4),  # GptOssConfig's defaults (gpt-oss-120b) at TP4: hidden 2880 = 22.5 x 128, N = 2880 / 4
    (8, 4096, 7688, 2),  # NemotronHConfig's defaults (Nemotron-H) at TP1: N = 7688 is 8 mod 16, so Triton compiles
    # the kernel without tt.divisibility on N (first product, ungated) and on K (second product)
)
"""Two shapes: each adds about a dozen Triton variants (two products, naive and sorted, with and without
bias, gated and ungated w13), and the kernel tier must stay under 6 minutes from a cold cache. The second is
the census's only served N that 16 does not divide (with DeepSeek-V2's 1407, at 64 experts: a larger bank)."""

_CENSUS_SHAPES = st.sampled_from(CENSUS_SHAPES)
_LEGACY_ACTIVATIONS = st.sampled_from([Activation(n) for n in ACTIVATIONS if not PARAMETERS.get(n, ((), ()))[0]])


@st.composite
def census_kernel_cases(
    draw: Callable[[st.SearchStrategy[Any]], Any],
    entrypoint: str,
    *,
    placement: Placement | st.SearchStrategy[Placement] | None = None,
    bias: bool | None = None,
) -> MoECase:
    """What the census adds, on a GPU: every activation with its limits, biases, the census's K and N.

    bfloat16, unquantized, no expert map, up to ``MAX_KERNEL_TOKENS`` tokens (both paths).
    The legacy entrypoint takes an activation's name only (``moegate.dispatch.calls``), so it
    draws the activations that need no parameter; the modular one draws them all.
    """
    if entrypoint not in ENTRYPOINTS:
        raise ValueError(f"unknown entrypoint {entrypoint!r}; expected one of {ENTRYPOINTS}")
    experts, hidden, inter, top_k = draw(_CENSUS_SHAPES)
    act = draw(_LEGACY_ACTIVATIONS if entrypoint == "legacy" else moe_activations())
    place = placement if isinstance(placement, Placement) else draw(placement or st.sampled_from(ALL_PLACEMENTS))
    return MoECase(
        num_tokens=draw(st.integers(1, MAX_KERNEL_TOKENS)),
        top_k=top_k,
        num_experts=experts,
        hidden=hidden,
        intermediate=inter,
        dtype="bfloat16",
        placement=place,
        routing=draw(routings()),
        activation=act,
        bias=draw(_PRESENT[bias]),
    )


BIASED_QUANT_SHAPE = (64, 256, 128)
"""A kernel-tier shape (``KERNEL_SHAPES``): quantized weights with biases add only their bias variants."""


@st.composite
def biased_quant_cases(draw: Callable[[st.SearchStrategy[Any]], Any], entrypoint: str, *, fp8: bool) -> MoECase:
    """Quantized weights with expert biases, where vLLM's kernels take them.

    fp8_w8a8 per-tensor or 128 x 128 (both entrypoints; ``fp8``: the GPU has fp8 tensor
    cores) and per-channel int8_w8a16 at the legacy entrypoint: the plain Triton kernel adds
    biases, the grouped wNa16 kernels take none (vLLM asserts it) and the modular wNa16
    experts launch the grouped kernel.
    """
    experts, hidden, inter = BIASED_QUANT_SHAPE
    schemes = (["fp8_w8a8"] if fp8 else []) + (["int8_w8a16"] if entrypoint == "legacy" else [])
    if not schemes:
        raise ValueError(f"no biased quantization runs at the {entrypoint} entrypoint here (fp8={fp8})")
    scheme = draw(st.sampled_from(schemes))
    group = draw(st.sampled_from((FP8_PER_TENSOR, FP8_BLOCK))) if scheme == "fp8_w8a8" else 0
    top_k = draw(st.sampled_from((1, 2, 4, 8)))
    return MoECase(
        num_tokens=draw(st.integers(1, MAX_KERNEL_TOKENS)),
        top_k=top_k,
        num_experts=experts,
        hidden=hidden,
        intermediate=inter,
        dtype="bfloat16",
        placement=draw(st.sampled_from(ALL_PLACEMENTS)),
        routing=draw(routings()),
        quant=Quant(scheme, group),
        bias=True,
    )


FP8_PATH_SHAPE = BIASED_QUANT_SHAPE
"""The shape of the two fp8 paths below (their Triton variants are the biased cases' less the bias)."""


@st.composite
def _fp8_path_cases(
    draw: Callable[[st.SearchStrategy[Any]], Any], quant: Quant, limit: bool, oai: bool = False
) -> MoECase:
    experts, hidden, inter = FP8_PATH_SHAPE
    return MoECase(
        num_tokens=draw(st.integers(1, MAX_KERNEL_TOKENS)),
        top_k=draw(st.sampled_from((1, 2, 4, 8))),
        num_experts=experts,
        hidden=hidden,
        intermediate=inter,
        placement=draw(st.sampled_from(ALL_PLACEMENTS)),
        routing=draw(routings()),
        quant=quant,
        activation=(
            Activation("swigluoai_uninterleave", limit=draw(st.sampled_from(space.LIMITS)), alpha=1.702, beta=1.0)
            if oai
            else Activation("silu", limit=draw(st.sampled_from(space.LIMITS)))
            if limit
            else Activation()
        ),
    )


def clamped_block_fp8_cases() -> st.SearchStrategy[MoECase]:
    """Block-fp8 (128 x 128) weights with a clamp-limited SiLU (the census's limits), for the modular entrypoint
    (the legacy one takes no limit): vLLM's fused SiLU + block-quant kernel has no clamp, so TritonExperts
    must not take it then (vLLM #57984). The inputs make the clamps bind (``activations.INPUT_GAIN``)."""
    return _fp8_path_cases(Quant("fp8_w8a8", FP8_BLOCK), True)


def block_fp8_oai_cases() -> st.SearchStrategy[MoECase]:
    """Block-fp8 weights with gpt-oss's SwiGLU (a clamp limit, alpha 1.702, beta 1) at the modular entrypoint: vLLM's
    fp8 methods hand the limit, alpha and beta to the experts in the quantization config as well (gemm1_*), a path
    of ``ApplyMoEActivationConfig.from_configs`` no unquantized case takes (the reach report's)."""
    return _fp8_path_cases(Quant("fp8_w8a8", FP8_BLOCK), True, oai=True)


def static_fp8_cases() -> st.SearchStrategy[MoECase]:
    """Per-tensor fp8 with static 0-D activation scales (``Quant.static_scales``), for either entrypoint and
    without an expert map: the launcher must reshape a 0-D scale (vLLM #40857)."""
    return _fp8_path_cases(Quant("fp8_w8a8", FP8_PER_TENSOR, static_scales=True), False)


WNA16_OFF_GRID_SHAPE = (8, 2880, 2880)
"""int4 at K 2880 (gpt-oss's hidden size, 22.5 x 128) in both GEMMs; group 64: 128 does not divide 2880, and at 32
vLLM 0.33.0 picks BLOCK_SIZE_K 96, three groups, which its CUDA kernel rejects (a crash on a clean build)."""
WNA16_OFF_GRID_GROUP = 64
WNA16_CUDA_TOKENS_PER_EXPERT = 6  # at most this many pairs per expert: vLLM's legacy int4 calls take the CUDA kernel
# (moegate.kernels.wna16_blocks.MAX_VALID_TOKENS_PER_EXPERT: strategies sit below kernels, a test holds them equal)


@st.composite
def wna16_off_grid_cases(draw: Callable[[st.SearchStrategy[Any]], Any]) -> MoECase:
    """Legacy int4 calls on vLLM's CUDA wNa16 kernel with K off the multiples of 128, whose heuristic's first
    BLOCK_SIZE_K (128) does not divide K (vLLM #30210). Device weights, no expert map."""
    experts, hidden, inter = WNA16_OFF_GRID_SHAPE
    tokens = draw(st.integers(1, MAX_KERNEL_TOKENS))
    top_ks = [k for k in (1, 2, 3, 4, 6, 8) if tokens * k <= WNA16_CUDA_TOKENS_PER_EXPERT * experts]
    return MoECase(
        num_tokens=tokens,
        top_k=draw(st.sampled_from(top_ks)),
        num_experts=experts,
        hidden=hidden,
        intermediate=inter,
        dtype=draw(_DTYPES_16),
        placement=Placement(False, False),
        routing=draw(routings()),
        quant=Quant("int4_w4a16", WNA16_OFF_GRID_GROUP),
    )


def shared_expert_kernel_cases(entrypoint: str) -> st.SearchStrategy[MoECase]:
    """Fused shared-expert rows on the kernel shapes: unquantized, no expert map (vLLM #51632)."""
    base = moe_cases(shared=True, dtype="bfloat16", kernel_shapes=True, max_tokens=MAX_KERNEL_TOKENS)
    return _supported(base, entrypoint, False, None)


__all__ = [
    "BIASED_QUANT_SHAPE",
    "BIG_SHAPE",
    "CENSUS_SHAPES",
    "FP8_BLOCKS",
    "FP8_PATH_SHAPE",
    "MAX_KERNEL_TOKENS",
    "WNA16_GROUP_SIZES",
    "biased_quant_cases",
    "block_fp8_oai_cases",
    "census_kernel_cases",
    "clamped_block_fp8_cases",
    "group_sizes",
    "kernel_cases",
    "shared_expert_kernel_cases",
    "static_fp8_cases",
    "wna16_off_grid_cases",
]
