"""Fixed kernel-tier cases for what the reach report found the random draws can miss (docs/design/reach.md).

The H100 reach record (``results/device-h100/``) left parts of vLLM's Triton experts that the census reaches
unexercised, though the tier's strategies can draw them: SiTU and GELU at the modular entrypoint (twelve
examples a property over eleven activations miss one often); batches past the tier's decode sizes
(``MAX_KERNEL_TOKENS``: vLLM's default config picks ``BLOCK_SIZE_M`` 64 past 96 tokens and 128 past 512, and
the alignment pads to it); grouped int8_w8a16 at the legacy entrypoint past 20 tokens (the Triton wNa16
kernel, whose default ``BLOCK_SIZE_M`` steps at 20 and 40). Each is a fixed call (parametrized, no Hypothesis
draw), at one kernel shape (``SHAPE``: vLLM has no tuned config for it, so its default config runs), against the
torch reference (``moegate.kernels.tolerance``) and the path the spec requires.

Grouped int8 at a shape vLLM ships a tuned config for (E=16, N=3072, int8_w8a16, H100 and H200) was drawn here
once and left: on the H100 (results/device-h100-2.md) a clean vLLM 0.33.0 raised ``TypeError: dynamic_func()
missing 1 required positional argument: 'SPLIT_K'``, the Triton wNa16 launch taking a tuned config without the
``SPLIT_K`` the default configs carry: a crash of the release itself, which a gate of pull requests against it
cannot hold as a test (every pull request would fail it). The reach report's reason for that arm says so.
"""

from __future__ import annotations

from typing import Any

import pytest

from moegate.core.activation import ACTIVATIONS, PARAMETERS, Activation
from moegate.core.case import ENTRYPOINTS, MoECase, Placement, Quant
from moegate.core.spec import expected_path
from moegate.kernels.check import run_checked

SHAPE = (64, 256, 128)
"""(experts, hidden, intermediate): a ``KERNEL_SHAPES`` entry the warm-up compiles; no vLLM tuned config has it."""

PARAMETERISED = {
    "silu": Activation("silu", limit=7.0),
    "swigluoai_uninterleave": Activation("swigluoai_uninterleave", limit=7.0, alpha=1.702, beta=1.0),
    "situ": Activation("situ", situ_beta=1.0, situ_linear_beta=2.0),
}
"""The census's parameters (golden/census/: silu and swigluoai_uninterleave at gpt-oss's limit 7, SiTU's beta 1)."""

MODULAR_ACTIVATIONS = [PARAMETERISED[n] if n in PARAMETERISED else Activation(n) for n in ACTIVATIONS]
LEGACY_ACTIVATIONS = [Activation(n) for n in ACTIVATIONS if not PARAMETERS.get(n, ((), ()))[0]]
"""The legacy ``fused_experts`` takes an activation's name only (``moegate.dispatch.calls``)."""


def _case(tokens: int, top_k: int, **fields: Any) -> MoECase:
    experts, hidden, inter = SHAPE
    return MoECase(
        num_tokens=tokens,
        top_k=top_k,
        num_experts=experts,
        hidden=hidden,
        intermediate=inter,
        placement=Placement(False, False),  # both weights on the device: one path a case, the spec's
        **fields,
    )


def _checked(cuda_target, bank, case: MoECase, entrypoint: str) -> None:
    result = run_checked(cuda_target, bank, case, entrypoint)
    assert result.path == expected_path(case, entrypoint).path.value, result.describe()
    assert result.closeness.ok, "output outside the tolerance of moegate.kernels.tolerance:\n" + result.describe()


@pytest.mark.parametrize(
    ("entrypoint", "act"),
    [("modular", a) for a in MODULAR_ACTIVATIONS] + [("legacy", a) for a in LEGACY_ACTIVATIONS],
    ids=lambda v: v.label if isinstance(v, Activation) else v,
)
def test_every_activation_matches_the_reference_at_each_entrypoint_that_takes_it(cuda_target, bank, entrypoint, act):
    _checked(cuda_target, bank, _case(4, 4, activation=act), entrypoint)


@pytest.mark.parametrize("entrypoint", ENTRYPOINTS)
@pytest.mark.parametrize("tokens", [100, 600])
def test_batches_past_the_decode_sizes_match_the_reference(cuda_target, bank, entrypoint, tokens):
    """100 tokens: vLLM's default config takes BLOCK_SIZE_M 64; 600: 128 (``get_default_config``)."""
    _checked(cuda_target, bank, _case(tokens, 8), entrypoint)


@pytest.mark.parametrize("tokens", [30, 50])
def test_grouped_int8_weights_past_20_tokens_match_the_reference_at_the_legacy_entrypoint(cuda_target, bank, tokens):
    """int8 is never vLLM's CUDA wNa16 kernel (int4 only): the Triton wNa16 kernel, BLOCK_SIZE_M 32 then 64."""
    _checked(cuda_target, bank, _case(tokens, 4, quant=Quant("int8_w8a16", 64)), "legacy")
