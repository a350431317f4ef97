"""The case space: every value the case strategies can draw, declared once and drawn from here.

``moe_cases`` builds its strategies from these values (``moegate.strategies.moe``), so
the space is the strategies' own, not a copy of them; ``tests/unit/strategies/test_census_coverage.py``
checks every configuration in the committed census of vLLM's MoE layers
(``golden/census/``) lies in it, and that ``moe_cases`` really draws it (Hypothesis ``find``).

What the census holds and where it lands here:

- experts, top-k, hidden (K), expert intermediate at a tensor-parallel degree (N): the
  ranges ``EXPERTS``, ``TOP_K``, ``HIDDEN``, ``INTERMEDIATE`` (drawn with ``wide=True``;
  real models reach 512 experts, top-12, hidden 8192, N from 64 to 22,528, many of them
  not multiples of 128: gpt-oss's 2880, Qwen2-MoE's 1408 / 8 = 176);
- fused shared experts: ``SHARED``;
- activations: ``ACTIVATIONS`` (every one vLLM's Triton experts accept), clamp limits
  ``LIMITS`` (10.0 is DeepSeek-V4's and GLM-5's default; 7.0 gpt-oss's fixed one), SwiGLU-OAI
  alpha and beta, SiTU's betas;
- expert biases: ``BIAS``;
- quantization: ``SCHEMES`` with fp8 block sizes ``FP8_GROUPS`` (vLLM ships tuned configs
  for 128 x 128 blocks and for 32 x 32 and 64 x 64) and wNa16 group sizes ``WNA16_GROUPS``;
- router weight on the input: ``ON_INPUT``;
- token counts up to ``MAX_TOKENS`` in the ordinary draws, and at the kernel's 32-bit index
  boundary (``moegate.core.index_width``) in ``index_width_cases``.
"""

from __future__ import annotations

from dataclasses import dataclass

from moegate.core.activation import ACTIVATIONS as CASE_ACTIVATIONS
from moegate.core.case import QUANT_SCHEMES


@dataclass(frozen=True)
class Range:
    """Integers from ``lo`` to ``hi``, both included."""

    lo: int
    hi: int

    def __contains__(self, value: object) -> bool:
        return isinstance(value, int) and self.lo <= value <= self.hi


EXPERTS = Range(1, 512)
"""Routed experts (fused shared rows come on top): vLLM's Triton alignment takes fewer than 1,024 padded."""
TOP_K = Range(1, 16)
"""Routed ids per token (LongCat-Flash routes 12, Qwen3-Next 10)."""
HIDDEN = Range(8, 16384)
INTERMEDIATE = Range(8, 32768)
"""N, the expert intermediate of one tensor-parallel rank."""
SHARED = (0, 1, 2)
"""Fused shared experts per layer (DeepSeek-V3, GLM-4.5, Qwen3-Next: 1; DeepSeek-V2: 2)."""
ACTIVATIONS = CASE_ACTIVATIONS
LIMITS = (0.5, 7.0, 10.0)
"""SwiGLU clamp limits drawn for silu and swigluoai_uninterleave."""
SWIGLU_ALPHAS = (None, 1.702)
SWIGLU_BETAS = (None, 1.0)
SITU_BETAS = (1.0, 4.0)
SITU_LINEAR_BETAS = (None, 2.0)
BIAS = (False, True)
SCHEMES: tuple[str | None, ...] = (None, *QUANT_SCHEMES)
FP8_GROUPS = (0, 32, 64, 128)
"""fp8 per-tensor (0) or block-wise g x g."""
WNA16_GROUPS = (-1, 0, 1, 32, 64, 128)
"""wNa16 per-channel (0 and -1, both encodings vLLM uses) or grouped (1: the clause's boundary)."""
ON_INPUT = (False, True)
MAX_TOKENS = 64
