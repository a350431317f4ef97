"""Fixed kernel-tier cases for what the reach report found the random draws can miss (docs/design/reach.md).

The H100 reach record (``results/device-h100/``) left parts of vLLM's Triton experts that the census reaches
unexercised, though the tier's strategies can draw them: SiTU and GELU at the modular entrypoint (twelve
examples a property over eleven activations miss one often); batches past the tier's decode sizes
(``MAX_KERNEL_TOKENS``: vLLM's default config picks ``BLOCK_SIZE_M`` 64 past 96 tokens and 128 past 512, and
the alignment pads to it); grouped int8_w8a16 at the legacy entrypoint past 20 tokens (the Triton wNa16
kernel, whose default ``BLOCK_SIZE_M`` steps at 20 and 40) and at a shape vLLM ships a tuned config for.
Each is a fixed call (parametrized, no Hypothesis draw), at one kernel shape (``SHAPE``: vLLM has no tuned
config for it, so its default config runs) but the last, against the torch reference
(``moegate.kernels.tolerance``) and the path the spec requires.
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


TUNED_WNA16_SHAPE = (16, 1024, 3072)
"""(experts, hidden, intermediate): vLLM 0.33.0 ships an int8_w8a16 config for E=16, N=3072 on the H100 and the
H200 (``configs/E=16,N=3072,device_name=NVIDIA_H100_80GB_HBM3,dtype=int8_w8a16.json``); a grouped ``block_shape``
``[0, g]`` names no block in the file name, so grouped int8 weights read it too (census: ``tuned`` int8_w8a16)."""


def test_grouped_int8_weights_at_a_shape_with_a_tuned_config_match_the_reference(cuda_target, bank):
    """The tuned BLOCK_SIZE_N and BLOCK_SIZE_K stand (``get_moe_wna16_block_config`` returns none of its own)."""
    experts, hidden, inter = TUNED_WNA16_SHAPE
    case = MoECase(
        num_tokens=4,
        top_k=2,
        num_experts=experts,
        hidden=hidden,
        intermediate=inter,
        placement=Placement(False, False),
        quant=Quant("int8_w8a16", 128),
    )
    _checked(cuda_target, bank, case, "legacy")
