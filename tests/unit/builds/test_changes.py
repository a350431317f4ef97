"""``moegate.builds.changes``: which compiled sources a pull request changed, and which the fused-MoE ops compile
from, read from real git repositories (``tests.support.vllm_tree``: a tiny csrc tree whose CMakeLists.txt names a
``_moe_C`` target as vLLM's does) and, where one is on this machine, from vLLM 0.33.0's own tree."""

from __future__ import annotations

import pytest

from moegate.builds.changes import ChangesError, compiled_changes, requirement_pins
from moegate.builds.sources import DirTree, moe_sources
from tests.support.vllm_tree import FILES, branch, commit, make_repo

MOE = "_moe_C_stable_libtorch"
C = "_C_stable_libtorch"


@pytest.fixture
def repo(tmp_path):
    return make_repo(tmp_path / "vllm")


def _pr(repo_and_base, changes):
    repo, base = repo_and_base
    branch(repo, "pr", base)
    return repo, base, commit(repo, changes, "the pull request")


def counted(ch):
    return {c.path: (c.why, c.targets) for c in ch.moe}


def test_a_change_to_the_alignment_kernel_counts_as_a_source_of_the_moe_target(repo):
    r, base, head = _pr(repo, {"csrc/moe/moe_align_sum_kernels.cu": "// padding = numel - 1\n"})
    ch = compiled_changes(r, base, head)
    assert counted(ch) == {"csrc/moe/moe_align_sum_kernels.cu": (f"a source of {MOE}", (MOE,))}
    assert ch.other == () and ch.compiled


def test_a_header_a_moe_source_includes_counts_and_so_does_one_it_includes_in_turn(repo):
    r, base, head = _pr(repo, {"csrc/dispatch_utils.h": "#pragma once\n// new\n",
                               "csrc/moe/permute_kernels/kernel.inl": "// changed\n"})  # fmt: skip
    assert counted(compiled_changes(r, base, head)) == {
        "csrc/dispatch_utils.h": ("included by csrc/moe/moe_align_sum_kernels.cu", (MOE,)),
        "csrc/moe/permute_kernels/kernel.inl": ("included by csrc/moe/permute_kernels/kernel.h", (MOE,)),
    }


def test_a_change_to_csrc_attention_alone_does_not_count(repo):
    r, base, head = _pr(repo, {"csrc/attention/paged.cu": "void paged_attention(int& o) { o = 2; }\n",
                               "csrc/attention/attention_utils.cuh": "#pragma once\n// v2\n"})  # fmt: skip
    ch = compiled_changes(r, base, head)
    assert ch.moe == ()
    assert ch.other == ("csrc/attention/attention_utils.cuh", "csrc/attention/paged.cu")
    assert ch.unbuilt([]) == []


def test_an_attention_header_counts_once_a_moe_source_includes_it(tmp_path):
    files = dict(FILES)
    files["csrc/moe/moe_ops.h"] = '#pragma once\n#include "attention/attention_utils.cuh"\n'
    r, base = make_repo(tmp_path / "vllm", files)
    branch(r, "pr", base)
    head = commit(r, {"csrc/attention/attention_utils.cuh": "#pragma once\n// v2\n"})
    assert counted(compiled_changes(r, base, head)) == {
        "csrc/attention/attention_utils.cuh": ("included by csrc/moe/moe_ops.h", (MOE,))
    }


def test_the_c_op_the_fused_moe_calls_through_custom_ops_counts_for_the_c_target(repo):
    r, base, head = _pr(repo, {"csrc/activation_kernels.cu": FILES["csrc/activation_kernels.cu"] + "// faster\n",
                               "csrc/activation_helpers.cuh": "#pragma once\n// v2\n",
                               "csrc/cache_kernels.cu": "void reshape_and_cache(int& key) {\n  key = 1;\n}\n"})  # fmt: skip
    ch = compiled_changes(r, base, head)
    assert counted(ch) == {
        "csrc/activation_kernels.cu": (f"defines {C} op silu_and_mul, which the fused MoE calls", (C,)),
        "csrc/activation_helpers.cuh": ("included by csrc/activation_kernels.cu", (C,)),
    }
    assert ch.other == ("csrc/cache_kernels.cu",)  # in _C, but no op of the fused MoE
    assert ch.unbuilt([MOE]) == ["csrc/activation_helpers.cuh", "csrc/activation_kernels.cu"]


def test_cmake_files_and_setup_py_count_for_the_moe_target(repo):
    r, base, head = _pr(repo, {"CMakeLists.txt": FILES["CMakeLists.txt"] + "# v2\n", "cmake/utils.cmake": "# v2\n",
                               "cmake/external_projects/flash_attn.cmake": "# v2\n", "setup.py": "# v2\n"})  # fmt: skip
    got = counted(compiled_changes(r, base, head))
    assert got == {
        "CMakeLists.txt": ("a CMake file", (MOE,)),
        "cmake/external_projects/flash_attn.cmake": ("a CMake file", (MOE,)),
        "cmake/utils.cmake": ("a CMake file", (MOE,)),
        "setup.py": ("vLLM's build script", (MOE,)),
    }


def test_a_torch_or_triton_pin_counts_and_other_requirement_edits_do_not(repo):
    r, base, head = _pr(repo, {
        "requirements/cuda.txt": "# CUDA, updated\ntorch==2.15.0\ntorchvision==0.30.0 # for images\n",
        "requirements/common.txt": "numpy>=2\ntriton_kernels==1.1 ; platform_machine == 'x86_64'\n",
        "pyproject.toml": FILES["pyproject.toml"].replace('"cmake>=3.26.1"', '"cmake>=3.27"'),
    })  # fmt: skip
    assert counted(compiled_changes(r, base, head)) == {
        "requirements/cuda.txt": ("a torch or Triton requirement changed: torch==2.14.0 -> torch==2.15.0", (MOE,)),
    }
    branch(r, "pr2", base)
    head2 = commit(r, {"pyproject.toml": FILES["pyproject.toml"].replace("2.14.0", "2.15.0"),
                       "requirements/common.txt": "numpy\ntriton == 3.7.0\n"})  # fmt: skip
    assert [c.path for c in compiled_changes(r, base, head2).moe] == ["pyproject.toml", "requirements/common.txt"]


def test_requirement_pins_read_requirements_files_and_pyproject_alike():
    assert requirement_pins("torch==2.14.0 # via vllm\ntorchaudio==2\ntriton>=3.6 ; sys_platform == 'linux'\n") == [
        "torch==2.14.0",
        "triton>=3.6",
    ]
    assert requirement_pins('requires = [\n  "torch == 2.14.0",\n  "triton_kernels",\n]') == ["torch==2.14.0"]


def test_a_file_the_pr_adds_to_the_moe_target_and_one_it_removes_both_count(repo):
    cmake = FILES["CMakeLists.txt"].replace('"csrc/moe/moe_align_sum_kernels.cu")', '"csrc/moe/topk.cu")')
    r, base, head = _pr(repo, {"CMakeLists.txt": cmake, "csrc/moe/topk.cu": "// new\n",
                               "csrc/moe/moe_align_sum_kernels.cu": None})  # fmt: skip
    got = counted(compiled_changes(r, base, head))
    assert got["csrc/moe/topk.cu"] == (f"a source of {MOE}", (MOE,))  # read at the head
    assert got["csrc/moe/moe_align_sum_kernels.cu"] == (f"a source of {MOE}", (MOE,))  # read at the base
    assert got["CMakeLists.txt"][0] == "a CMake file"


def test_generated_sources_the_glob_takes_and_their_generator_count(repo):
    r, base, head = _pr(repo, {"csrc/moe/marlin/sm80_kernel_u4.cu": "// regenerated\n",
                               "csrc/quantization/marlin/generate_kernels.py": "print('v2')\n"})  # fmt: skip
    assert counted(compiled_changes(r, base, head)) == {
        "csrc/moe/marlin/sm80_kernel_u4.cu": (f"a source of {MOE}", (MOE,)),
        "csrc/quantization/marlin/generate_kernels.py": (f"named in {MOE}'s CMake block", (MOE,)),
    }


def test_only_the_pull_requests_own_changes_count_not_mains_since_it_forked(repo):
    r, fork = repo
    branch(r, "pr", fork)
    head = commit(r, {"docs/index.md": "# vLLM, reworded\n"})
    r_main = r
    from tests.support.vllm_tree import git

    git(r_main, "checkout", "-q", "main")
    main_tip = commit(r_main, {"csrc/moe/moe_align_sum_kernels.cu": "// main moved on\n"})
    ch = compiled_changes(r, main_tip, head)  # the base as a workflow sees it: main's tip
    assert ch.base == fork and ch.changed == ("docs/index.md",) and not ch.compiled


def test_a_python_only_change_changes_no_compiled_source(repo):
    r, base, head = _pr(repo, {"vllm/model_executor/layers/fused_moe/fused_moe.py": "# reworded\n"})
    ch = compiled_changes(r, base, head)
    assert (ch.moe, ch.other, ch.compiled) == ((), (), False)


def test_bad_input_is_one_line(tmp_path, repo):
    r, base = repo
    (tmp_path / "plain").mkdir()
    cases = [
        (tmp_path / "plain", base, base, "plain: not a git repository"),
        (tmp_path / "absent", base, base, "absent: no such folder"),
        (r, "0" * 40, base, f"no commit {'0' * 40}"),
        (r, base, "no-such-branch", "no commit no-such-branch"),
    ]
    for where, b, h, says in cases:
        with pytest.raises(ChangesError, match=says) as info:
            compiled_changes(where, b, h)
        assert "\n" not in str(info.value)


def test_a_tree_without_a_moe_target_is_not_a_vllm_tree(tmp_path):
    files = {"CMakeLists.txt": "project(x)\nadd_library(x x.cpp)\n", "x.cpp": ""}
    r, base = make_repo(tmp_path / "other", files)
    head = commit(r, {"x.cpp": "int x;\n"})
    with pytest.raises(ChangesError, match="not a vLLM tree at either commit .*defines no _moe_C extension"):
        compiled_changes(r, base, head)


def test_vllm_0_33_0s_moe_target_is_read_from_its_own_cmakelists(real_tree):
    s = moe_sources(DirTree(real_tree))
    assert [t.target for t in s.moe_targets] == [MOE]
    assert set(s.moe_targets[0].files) >= {
        "csrc/moe/torch_bindings.cpp", "csrc/moe/moe_align_sum_kernels.cu", "csrc/moe/topk_softmax_kernels.cu",
        "csrc/moe/moe_wna16.cu", "csrc/moe/moe_permute_unpermute_op.cu", "csrc/moe/marlin_moe_wna16/ops.cu",
    }  # fmt: skip
    assert s.reasons["csrc/core/registration.h"] == "included by csrc/moe/torch_bindings.cpp"
    assert s.reasons["csrc/quantization/marlin/generate_kernels.py"] == f"named in {MOE}'s CMake block"
    assert "silu_and_mul" in s.c_ops and s.targets["csrc/activation_kernels.cu"] == frozenset({C})
    assert not [p for p in s.reasons if p.startswith("csrc/attention/")]


def test_vllm_0_33_0_attention_alone_does_not_count_and_the_alignment_kernel_does(real_tree, tmp_path):
    files = {p.relative_to(real_tree).as_posix(): p.read_text(errors="replace")
             for p in real_tree.rglob("*") if p.is_file()}  # fmt: skip
    r, base = make_repo(tmp_path / "vllm", files)
    branch(r, "attention", base)
    att = commit(r, {"csrc/attention/merge_attn_states.cu": files["csrc/attention/merge_attn_states.cu"] + "//\n"})
    ch = compiled_changes(r, base, att)
    assert (ch.moe, ch.other) == ((), ("csrc/attention/merge_attn_states.cu",))
    branch(r, "align", base)
    align = files["csrc/moe/moe_align_sum_kernels.cu"]
    bug = commit(r, {"csrc/moe/moe_align_sum_kernels.cu": align.replace("] = numel;", "] = numel - 1;")})
    assert counted(compiled_changes(r, base, bug)) == {
        "csrc/moe/moe_align_sum_kernels.cu": (f"a source of {MOE}", (MOE,))
    }
