"""A small vLLM-shaped git repository for the compiled-changes tests: a csrc tree whose CMakeLists.txt names a
``_C_stable_libtorch`` and a ``_moe_C_stable_libtorch`` target as vLLM 0.33.0's does (set/list(APPEND)/file(GLOB),
an if block, a generator path), a fused-MoE package that calls a ``_C`` op through ``_custom_ops``, setup.py and
requirements. Real git, real commits; ``commit`` changes files and returns the new SHA.

``real_vllm_tree`` finds a real vLLM source tree for the tests that read one: ``MOEGATE_VLLM_SRC`` (a folder or an
sdist tarball), else the sdist the device rehearsal uses at ``/tmp/sdist/vllm-0.33.0.tar.gz``.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

SDIST = Path("/tmp/sdist/vllm-0.33.0.tar.gz")

CMAKELISTS = """\
cmake_minimum_required(VERSION 3.26)
project(vllm_extensions LANGUAGES CXX)
include(${CMAKE_CURRENT_LIST_DIR}/cmake/utils.cmake)
find_package(Torch REQUIRED)
include(FetchContent)

set(VLLM_STABLE_EXT_SRC
  "csrc/torch_bindings.cpp"
  "csrc/activation_kernels.cu"
  "csrc/cache_kernels.cu"
  "csrc/attention/paged.cu")
define_extension_target(
  _C_stable_libtorch
  DESTINATION vllm
  LANGUAGE ${VLLM_GPU_LANG}
  SOURCES ${VLLM_STABLE_EXT_SRC}
  USE_SABI 3
  WITH_SOABI)

#
# _moe_C_stable_libtorch extension
#
set(VLLM_MOE_EXT_SRC
  "csrc/moe/torch_bindings.cpp"
  "csrc/moe/moe_align_sum_kernels.cu")   # the block alignment and moe_sum

if(VLLM_GPU_LANG STREQUAL "CUDA")
  set(MOE_PERMUTE_SRC
      "csrc/moe/permute.cu")
  list(APPEND VLLM_MOE_EXT_SRC "${MOE_PERMUTE_SRC}")
  set(MOE_MARLIN_GEN_SCRIPT
    ${CMAKE_CURRENT_SOURCE_DIR}/csrc/quantization/marlin/generate_kernels.py)
  file(GLOB MARLIN_MOE_SRC "csrc/moe/marlin/sm80_kernel_*.cu")
  list(APPEND VLLM_MOE_EXT_SRC ${MARLIN_MOE_SRC})
endif()

define_extension_target(
  _moe_C_stable_libtorch
  DESTINATION vllm
  LANGUAGE ${VLLM_GPU_LANG}
  SOURCES ${VLLM_MOE_EXT_SRC}
  USE_SABI 3
  WITH_SOABI)
target_compile_definitions(_moe_C_stable_libtorch PRIVATE USE_CUDA)

include(cmake/external_projects/flash_attn.cmake)
"""

FILES = {
    "CMakeLists.txt": CMAKELISTS,
    "cmake/utils.cmake": "function(define_extension_target NAME)\nendfunction()\n",
    "cmake/external_projects/flash_attn.cmake": "# fetched\n",
    "setup.py": "import os\nos.getenv('VLLM_PRECOMPILED_WHEEL_LOCATION')\n",
    "pyproject.toml": '[build-system]\nrequires = [\n  "cmake>=3.26.1",\n  "torch == 2.14.0",\n]\n',
    "requirements/cuda.txt": "# CUDA\ntorch==2.14.0\ntorchvision==0.29.0 # for images\n",
    "requirements/common.txt": "numpy\ntriton_kernels==1.0 ; platform_machine == 'x86_64'\n",
    "csrc/dispatch_utils.h": "#pragma once\n",
    "csrc/core/registration.h": "#pragma once\n#include <Python.h>\n",
    "csrc/torch_bindings.cpp": '#include "core/registration.h"\n#include "ops.h"\n',
    "csrc/ops.h": "void silu_and_mul(int& out, int& in);\n",
    "csrc/activation_kernels.cu": (
        '#include "activation_helpers.cuh"\n'
        "void silu_and_mul(int& out,   // [..., d]\n                  int& in)    // [..., 2 * d]\n{\n  out = in;\n}\n"
    ),
    "csrc/activation_helpers.cuh": "#pragma once\n",
    "csrc/cache_kernels.cu": "void reshape_and_cache(int& key) {\n  key = 0;\n}\n",
    "csrc/attention/paged.cu": '#include "attention/attention_utils.cuh"\nvoid paged_attention(int& o) { o = 1; }\n',
    "csrc/attention/attention_utils.cuh": "#pragma once\n",
    "csrc/moe/torch_bindings.cpp": '#include "core/registration.h"\n#include "moe_ops.h"\n',
    "csrc/moe/moe_ops.h": "#pragma once\n",
    "csrc/moe/moe_align_sum_kernels.cu": (
        '#include <cub/cub.cuh>\n#include "dispatch_utils.h"\n'
        "void moe_align_block_size(int numel, int* sorted) {\n  sorted[0] = numel;\n}\n"
    ),
    "csrc/moe/permute.cu": '#include "moe/permute_kernels/kernel.h"\n',
    "csrc/moe/permute_kernels/kernel.h": '#pragma once\n#include "kernel.inl"\n',
    "csrc/moe/permute_kernels/kernel.inl": "// inline part\n",
    "csrc/moe/marlin/sm80_kernel_u4.cu": "// generated\n",
    "csrc/quantization/marlin/generate_kernels.py": "print('kernels')\n",
    "vllm/__init__.py": "",
    "vllm/_custom_ops.py": (
        "import torch\n\n\ndef silu_and_mul(\n    out, x\n) -> None:\n    torch.ops._C.silu_and_mul(out, x)\n\n\n"
        "def paged_attention(out):\n    torch.ops._C.paged_attention(out)\n\n\n"
        "def moe_sum(x, out):\n    torch.ops._moe_C.moe_sum(x, out)\n"
    ),
    "vllm/model_executor/layers/fused_moe/__init__.py": "",
    "vllm/model_executor/layers/fused_moe/fused_moe.py": (
        "from vllm import _custom_ops as ops\n\n\ndef experts(x, out):\n    ops.silu_and_mul(out, x)\n"
        "    ops.moe_sum(x, out)\n"
    ),
    "docs/index.md": "# vLLM\n",
}


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env).stdout


def commit(repo: Path, changes: dict[str, str | None], message: str = "change") -> str:
    """Write (or, for None, delete) each file, commit, and return the commit's SHA."""
    for path, text in changes.items():
        target = repo / path
        if text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def make_repo(path: Path, files: dict[str, str] | None = None) -> tuple[Path, str]:
    """A repository at ``path`` with the tiny tree (or ``files``) committed on ``main``; returns it and the SHA."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    return path, commit(path, dict(FILES if files is None else files), "the tree")


def branch(repo: Path, name: str, start: str) -> None:
    git(repo, "checkout", "-q", "-b", name, start)


def real_vllm_tree(dest: Path) -> Path | None:
    """A real vLLM source tree (csrc, cmake, CMakeLists.txt, setup.py, requirements, the fused-MoE package), copied
    under ``dest``; None where none is on this machine."""
    given = os.environ.get("MOEGATE_VLLM_SRC")
    source = Path(given) if given else SDIST
    if source.is_dir():
        return source
    if not source.is_file():
        return None
    keep = ("csrc/", "cmake/", "CMakeLists.txt", "setup.py", "pyproject.toml", "requirements/",
            "vllm/_custom_ops.py", "vllm/model_executor/layers/fused_moe/")  # fmt: skip
    with tarfile.open(source) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.partition("/")[2].startswith(keep)]
        for m in members:
            m.name = m.name.partition("/")[2]
        tar.extractall(dest, members=members, filter="data")
    return dest
