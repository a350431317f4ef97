"""vLLM's offline engine as ``moegate.model.engine`` uses it: the public API only (``LLM``, ``SamplingParams``, ``EngineArgs``).

Each function imports vLLM when called, never at import time: the engine
scenarios set vLLM's environment variables first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

FIXED_KV_CACHE_BYTES = 256 << 20
"""The KV cache every moegate offline engine on a GPU asks for (``kv_cache_memory_bytes``). Given a size, vLLM
skips its memory profiling, which compares free memory before and after a dummy run and stops the engine when
another process on the GPU let memory go in between (``AssertionError: Error in memory profiling``): on the
H200 rehearsal of 2026-12-02 that stopped 3 and 5 engine scenarios of the kernels leg while the e2e legs' servers
ran beside it. 256 MiB holds the engines' few short prompts (at most 256 positions) many times over."""


def version() -> str:
    """The installed vLLM's version."""
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def engine_arg_names() -> set[str]:
    """Every keyword vLLM's ``EngineArgs`` (hence ``LLM``) accepts."""
    from vllm import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


def offline_engine(model: str, **kwargs: Any) -> Any:
    """``vllm.LLM(model=model, **kwargs)``."""
    from vllm import LLM

    return LLM(model=model, **kwargs)


def greedy_sampling(max_tokens: int) -> Any:
    """Greedy ``SamplingParams`` for exactly ``max_tokens`` token ids (no EOS stop, no detokenizing)."""
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
