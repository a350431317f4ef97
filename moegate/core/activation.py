"""The experts' activation: every one vLLM's Triton fused MoE runs, the parameters each takes, and ``Activation``,
a case's choice of one (``moegate.kernels.activations`` states the math)."""

from __future__ import annotations

from dataclasses import dataclass

GATED_ACTIVATIONS: tuple[str, ...] = (
    "silu",
    "gelu",
    "gelu_tanh",
    "swigluoai",
    "swigluoai_uninterleave",
    "swiglustep",
    "situ",
)
"""Gated activations vLLM's Triton fused MoE runs: w13 holds 2N rows, a gate half and an up half."""

UNGATED_ACTIVATIONS: tuple[str, ...] = ("silu_no_mul", "gelu_no_mul", "gelu_tanh_no_mul", "relu2_no_mul")
"""Activations without the gate product: w13 holds N rows and the activation maps each element alone."""

ACTIVATIONS: tuple[str, ...] = GATED_ACTIVATIONS + UNGATED_ACTIVATIONS
"""Every activation vLLM 0.33.0's Triton experts accept (``apply_moe_activation``); the census lists them."""

ACTIVATION_PARAMS: tuple[str, ...] = ("limit", "alpha", "beta", "situ_beta", "situ_linear_beta")

PARAMETERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # activation: (parameters it requires, parameters it may take)
    "silu": ((), ("limit",)),
    "swigluoai_uninterleave": (("limit",), ("alpha", "beta")),
    "situ": (("situ_beta",), ("situ_linear_beta",)),
}
"""Which activations take parameters, as vLLM's layer config carries them (``swiglu_limit``, ``swiglu_alpha``,
``swiglu_beta``, ``activation_situ_beta``, ``activation_situ_linear_beta``); every other activation takes none.
``swigluoai`` and ``swiglustep`` have fixed limits of their own (``moegate.kernels.activations``)."""


@dataclass(frozen=True)
class Activation:
    """The experts' activation and its parameters (``moegate.kernels.activations`` states the math).

    ``limit``: the SwiGLU clamp limit (silu: optional, swigluoai_uninterleave: required).
    ``alpha``, ``beta``: swigluoai_uninterleave's sigmoid scale and up offset (vLLM's defaults 1 and 0).
    ``situ_beta``, ``situ_linear_beta``: SiTU's gate and up soft-clip scales. Only the modular
    entrypoint can be handed parameters: the legacy ``fused_experts`` takes the activation's name alone.
    """

    name: str = "silu"
    limit: float | None = None
    alpha: float | None = None
    beta: float | None = None
    situ_beta: float | None = None
    situ_linear_beta: float | None = None

    def __post_init__(self) -> None:
        if self.name not in ACTIVATIONS:
            raise ValueError(f"unknown activation {self.name!r}; expected one of {ACTIVATIONS}")
        required, optional = PARAMETERS.get(self.name, ((), ()))
        given = {p for p in ACTIVATION_PARAMS if getattr(self, p) is not None}
        missing = [p for p in required if p not in given]
        extra = sorted(given - set(required) - set(optional))
        if missing or extra:
            said = ([f"needs {', '.join(missing)}"] if missing else []) + (
                [f"takes no {', '.join(extra)}"] if extra else []
            )
            raise ValueError(f"activation {self.name}: " + "; ".join(said))
        if self.limit is not None and not self.limit > 0:
            raise ValueError(f"activation {self.name}: limit={self.limit} must be > 0")

    @property
    def gated(self) -> bool:
        return self.name in GATED_ACTIVATIONS

    @property
    def parameterised(self) -> bool:
        """True when the activation carries parameters the legacy entrypoint cannot be handed."""
        return any(getattr(self, p) is not None for p in ACTIVATION_PARAMS)

    def params(self) -> dict[str, float]:
        """The parameters given, by field name."""
        return {p: v for p in ACTIVATION_PARAMS if (v := getattr(self, p)) is not None}

    @property
    def label(self) -> str:
        given = ",".join(f"{p}={v:g}" for p, v in self.params().items())
        return self.name + (f"({given})" if given else "")
