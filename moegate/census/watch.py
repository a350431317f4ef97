"""The paths of vLLM's tree whose change reaches the fused MoE: what a CI's path filter watches to run the gate.

Read from a census (the newest committed golden by default, so no vLLM is needed): every file the census names (the
layer builder, each model file that builds a fused-MoE layer, each MoE quantization method, each dispatch site), as
a path of vLLM's repository, plus the folders the census reads whole:

- ``vllm/model_executor/layers/fused_moe/``: the decision, the aligners' wrappers, the Triton kernels, the builders,
  the activations and the tuned configs (a file there is named by its folder, not again);
- ``vllm/model_executor/models/registry.py`` and ``vllm/transformers_utils/configs/``: how the census maps an
  architecture to its model file and pins a layer's shape;
- ``csrc/moe/``: the compiled aligners (``moe_align_block_size``) the sites call, which no Python file shows;
- from ``moegate.dispatch.names``, where moegate spells every vLLM module it relies on: the UVA offloader's package and
  the loader's post-processing (``device_loading_context`` re-offloads what lost its marker).

The one list: ``moegate census paths`` prints it, ``moegate buildkite`` writes it as ``source_file_dependencies`` and
``tooling/ci/moe_paths.py`` as the GitHub caller's ``moe-paths.txt``.

A folder ends in ``/``: a prefix as Buildkite's ``source_file_dependencies`` takes it (``moegate buildkite``); a
GitHub ``paths:`` filter writes it ``<folder>**``. ``moegate census paths`` prints the list, one a line.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from moegate.census import archs, builders, census, configs
from moegate.core import golden_files
from moegate.dispatch import names

PACKAGE = "vllm"
"""The census's file names are relative to the vllm package; the repository holds it under this folder."""
FUSED_MOE = f"{PACKAGE}/{PurePosixPath(builders.LAYER_MODULE).parent}/"
READ_WHOLE = (FUSED_MOE, f"{PACKAGE}/{configs.VLLM_CONFIGS}/")
"""The folders the census reads whole."""
READ_FILES = (f"{PACKAGE}/{archs.REGISTRY}", names.LOADER_UTILS.replace(".", "/") + ".py")
"""The files it reads that no record names, and the loader's re-offload."""
OFFLOADER = "/".join(names.UVA_OFFLOADER_MODULE.split(".")[:-1]) + "/"
"""The UVA offloader's package: what makes expert weights host-resident."""
COMPILED = ("csrc/moe/",)
"""Sources of the compiled ops the dispatch sites call (the aligners): a change there reaches the kernels."""


def watched_paths(records: Iterable[dict[str, Any]]) -> list[str]:
    """Sorted, each once: the folders above, then every file a record names that no folder already holds."""
    folders = (*COMPILED, *READ_WHOLE, OFFLOADER)
    files = {f"{PACKAGE}/{rec['file']}" for rec in records if rec.get("file")} | set(READ_FILES)
    return sorted(set(folders) | {f for f in files if not f.startswith(folders)})


def newest_golden(directory: Path | None = None) -> Path:
    """The newest committed census golden (the release under review); ``FileNotFoundError`` when there is none."""
    goldens = census.committed(directory)
    if not goldens:
        raise FileNotFoundError(f"no census golden in {(directory or golden_files.GOLDEN_DIR) / census.GOLDEN_DIR}")
    return goldens[next(reversed(goldens))]


def golden_paths(path: Path | None = None) -> list[str]:
    """``watched_paths`` of a census golden (default: the newest committed one)."""
    found = path or newest_golden()
    return watched_paths(census.parse_golden(found.read_text(encoding="utf-8")))
