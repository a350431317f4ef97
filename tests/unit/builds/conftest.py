"""Fixtures the builds room's tests share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.vllm_tree import real_vllm_tree


@pytest.fixture(scope="module")
def real_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM's real source tree (MOEGATE_VLLM_SRC, or the 0.33.0 sdist in /tmp/sdist); skipped with how to get one."""
    tree = real_vllm_tree(tmp_path_factory.mktemp("vllm-src"))
    if tree is None:
        pytest.skip(
            "no vLLM source tree here: set MOEGATE_VLLM_SRC to a folder or sdist (or put vllm-0.33.0.tar.gz in /tmp/sdist)"
        )
    return tree
