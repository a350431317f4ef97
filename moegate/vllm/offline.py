"""vLLM's offline engine as ``moegate.model.engine`` uses it: the public API only (``LLM``, ``SamplingParams``, ``EngineArgs``).

Each function imports vLLM when called, never at import time: the engine
scenarios set vLLM's environment variables first.
"""

from __future__ import annotations

import dataclasses
from typing import Any


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
