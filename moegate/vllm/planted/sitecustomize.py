"""A planted bug for the e2e tier: vLLM's Qwen3-MoE block output scaled by ``MOEGATE_PLANTED_MOE_SCALE``.

Put this folder first on a build's module search path through the environment (as
``tests/e2e/test_e2e_cpu.py`` does; the interpreter-made replacement is ``python -m
moegate.vllm.planted DEST --python PY --bug scale=F``) and every interpreter of that build's server (API server, engine core, workers) runs it at start:
when ``vllm.model_executor.models.qwen3_moe`` is imported, ``Qwen3MoeSparseMoeBlock.forward`` is
wrapped so that the MoE output, on every dispatch path, is multiplied by the scale. It is the H200's
planted bug of 2026-12 (a 1.005 scale shifted every sequence's log-likelihood the same way), made
available to a CPU build: a real server computing something slightly wrong, for the scored
comparison's systematic-shift clause to find. Nothing happens without the variable, or at 1.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

TARGET = "vllm.model_executor.models.qwen3_moe"
SCALE = float(os.environ.get("MOEGATE_PLANTED_MOE_SCALE") or 1.0)


def _patch(module: Any) -> None:
    block = module.Qwen3MoeSparseMoeBlock
    original = block.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, *args, **kwargs) * SCALE

    block.forward = forward


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if SCALE != 1.0:
    sys.meta_path.insert(0, _Finder())
