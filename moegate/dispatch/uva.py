"""Host residency the way vLLM makes it: the UVA marker, UVA host views, vLLM's offloader and loader context.

Decision-only calls need the marker alone (``mark``); calls that run to the end
(the kernel tier, CUDA only) need real host memory the GPU reads in place
(``host_view``), or vLLM's own ``UVAOffloader`` and ``device_loading_context``
acting on a layer.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from moegate.dispatch.names import UVA_MARKER, TargetError


def mark(w: torch.Tensor, host: bool) -> torch.Tensor:
    """A fresh tensor object over ``w``, carrying vLLM's UVA marker when ``host``.

    For decision-only calls: the decision reads the marker and nothing else, so
    no pinned copy is paid per case. Calls that run to the end get real UVA
    weights (``host_view``) through the ``WeightBank``.
    """
    view = w.view(w.shape)  # fresh object: no marker left from an earlier case
    if host:
        setattr(view, UVA_MARKER, True)
    return view


def uva_available() -> bool:
    """Whether vLLM can read host memory in place here (UVA: pinned memory mapped for the GPU)."""
    if not torch.cuda.is_available():
        return False
    try:
        from vllm.utils.platform_utils import is_uva_available
    except ImportError:  # a release without the helper: pinned memory is the requirement
        return True
    return bool(is_uva_available())


def host_view(w: torch.Tensor, *, mark: bool = True) -> torch.Tensor:
    """Pinned host copy of ``w`` seen through vLLM's UVA view op; ``mark=False`` leaves the marker off.

    An unmarked view is host memory vLLM does not know about: the kernel
    reads it over PCIe on whatever path the rest of the rule picks. The
    traffic benchmark uses it to time the naive path on host weights.
    """
    from vllm.utils.torch_utils import get_accelerator_view_from_cpu_tensor

    pinned = torch.empty(w.shape, dtype=w.dtype, device="cpu", pin_memory=True)
    pinned.copy_(w)
    view = get_accelerator_view_from_cpu_tensor(pinned)
    view._moegate_pinned = pinned  # keep the host memory alive with the view
    if mark:
        setattr(view, UVA_MARKER, True)
    return view


def uva_offload(module: torch.nn.Module, max_bytes: int, param_names: set[str]) -> list[str]:
    """Offload ``module``'s named parameters with vLLM's ``UVAOffloader`` under a byte budget.

    Per-parameter, in registration order, stopping once the budget is reached:
    a budget of one weight's size leaves the next weight on the device (the
    budget cut-off). Returns the names that carry the UVA marker afterwards.
    """
    from vllm.model_executor.offloader.uva import UVAOffloader

    offloader = UVAOffloader(cpu_offload_max_bytes=max_bytes, cpu_offload_params=set(param_names))
    if not offloader.uva_offloading:
        raise TargetError("vLLM reports UVA unavailable here (no pinned memory); host-resident weights need it")
    offloader.wrap_modules(iter([module]))
    return [n for n, p in module.named_parameters() if getattr(p, UVA_MARKER, False)]


def uva_offload_layers(layers: Iterable[torch.nn.Module], max_bytes: int, segments: set[str]) -> int:
    """Offload decoder layers the way vLLM's loader does: one ``UVAOffloader``, one budget, the layers in order.

    ``segments`` are ``cpu_offload_params`` entries, matched against names relative to each layer.
    Returns the bytes the offloader says it moved.
    """
    from vllm.model_executor.offloader.uva import UVAOffloader

    offloader = UVAOffloader(cpu_offload_max_bytes=max_bytes, cpu_offload_params=set(segments))
    if not offloader.uva_offloading:
        raise TargetError("vLLM reports UVA unavailable here (no pinned memory); host-resident weights need it")
    offloader.wrap_modules(iter(layers))
    return int(offloader.cpu_offload_bytes)


def process_weights_after_loading(module: torch.nn.Module, device: torch.device) -> None:
    """Run ``module.process_weights_after_loading()`` inside vLLM's ``device_loading_context``.

    That is how vLLM's loader finalises each layer: parameters replaced there
    lose the UVA marker and the context re-offloads and re-marks them on exit.
    """
    from vllm.model_executor.model_loader.utils import device_loading_context

    process = module.process_weights_after_loading
    if not callable(process):  # a torch module's attribute: vLLM's layers define it as a method
        raise TargetError(f"{type(module).__name__} has no process_weights_after_loading(): not a vLLM layer")
    with device_loading_context(module, device):
        process()


def replace_parameter(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """vLLM's own ``replace_parameter``, as quantization methods call it after loading."""
    from vllm.model_executor.utils import replace_parameter as vllm_replace_parameter

    vllm_replace_parameter(module, name, tensor)
