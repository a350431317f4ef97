"""``moegate.builds.moe_build``: the offline CMake project cut from vLLM's own CMakeLists.txt, and the built
library put into a site or a wheel. (The build itself needs nvcc and a CUDA torch: ``lab/gpu/compiled.sh`` runs it
on the device; what a CPU can check is here.)"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile

import pytest

from moegate.builds.cmake import commands, target_sources
from moegate.builds.moe_build import BuildError, install, project_text, write_project
from moegate.builds.sources import DirTree, moe_sources
from tests.support.vllm_tree import CMAKELISTS, FILES

MOE = "_moe_C_stable_libtorch"


def test_the_project_is_the_prelude_then_cutlass_then_the_moe_block_as_written(tmp_path):
    text = project_text(CMAKELISTS, tmp_path / "cutlass")
    prelude, rest = text.split("# moegate: CUTLASS", 1)
    assert prelude.rstrip() == CMAKELISTS[: CMAKELISTS.index("include(FetchContent)")].rstrip()
    assert f'set(CUTLASS_INCLUDE_DIR "{tmp_path / "cutlass" / "include"}")' in rest
    start = CMAKELISTS.index("set(VLLM_MOE_EXT_SRC")
    end = CMAKELISTS.index("target_compile_definitions(_moe_C_stable_libtorch PRIVATE USE_CUDA)") + len(
        "target_compile_definitions(_moe_C_stable_libtorch PRIVATE USE_CUDA)"
    )
    assert rest.endswith(CMAKELISTS[start:end] + "\n")  # whole statements: the if block, the definitions after it
    assert "_C_stable_libtorch\n  DESTINATION" not in rest.replace(MOE, "") and "FetchContent" not in rest
    assert "flash_attn.cmake" not in text


def test_a_tree_whose_moe_target_includes_cutlass_needs_a_cutlass_tree(tmp_path):
    src = tmp_path / "src"
    for path, body in FILES.items():
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(body)
    cmake = src / "CMakeLists.txt"
    cmake.write_text(CMAKELISTS.replace("USE_SABI 3\n  WITH_SOABI)\ntarget_compile_definitions(_moe",
                                        "INCLUDE_DIRECTORIES ${CUTLASS_INCLUDE_DIR}\n  USE_SABI 3\n  WITH_SOABI)\n"
                                        "target_compile_definitions(_moe"))  # fmt: skip
    with pytest.raises(BuildError, match="includes CUTLASS's headers: give --cutlass DIR"):
        write_project(src, tmp_path / "build", None)
    with pytest.raises(BuildError, match="not a CUTLASS tree"):
        write_project(src, tmp_path / "build", tmp_path)
    (tmp_path / "cutlass" / "include" / "cutlass").mkdir(parents=True)
    project = write_project(src, tmp_path / "build", tmp_path / "cutlass")
    assert (project / "csrc").resolve() == (src / "csrc").resolve() and (project / "CMakeLists.txt").is_file()
    with pytest.raises(BuildError, match="no CMakeLists.txt: not a vLLM source tree"):
        write_project(tmp_path / "cutlass", tmp_path / "build2", None)


def _site(root, libs):
    (root / "vllm").mkdir(parents=True)
    for name, data in libs.items():
        (root / "vllm" / name).write_bytes(data)
    return root


def test_install_replaces_the_sites_moe_library_and_nothing_else(tmp_path):
    site = _site(tmp_path / "site", {f"{MOE}.abi3.so": b"old", "_C_stable_libtorch.abi3.so": b"c"})
    built = tmp_path / "build" / f"{MOE}.abi3.so"
    built.parent.mkdir()
    built.write_bytes(b"new")
    assert install(built, site) == site / "vllm" / f"{MOE}.abi3.so"
    assert (site / "vllm" / f"{MOE}.abi3.so").read_bytes() == b"new"
    assert sorted(p.name for p in (site / "vllm").iterdir()) == ["_C_stable_libtorch.abi3.so", f"{MOE}.abi3.so"]
    with pytest.raises(BuildError, match="no _moe_C_stable_libtorch.abi3.so to replace"):
        install(built, _site(tmp_path / "bare", {}))


def test_install_into_a_wheel_writes_a_new_wheel_whose_record_holds_the_new_hash(tmp_path):
    wheel = tmp_path / "pr" / "vllm-1-cp38-abi3-linux_x86_64.whl"
    wheel.parent.mkdir()
    member = f"vllm/{MOE}.abi3.so"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr(member, b"old")
        z.writestr("vllm-1.dist-info/RECORD", f"vllm/__init__.py,sha256=x,0\n{member},sha256=old,3\nRECORD,,\n")
    built = tmp_path / f"{MOE}.abi3.so"
    built.write_bytes(b"rebuilt")
    with pytest.raises(BuildError, match="give an output folder other than its own"):
        install(built, wheel, wheel.parent)
    out = install(built, wheel, tmp_path / "out")
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"rebuilt").digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(out) as z:
        assert z.read(member) == b"rebuilt"
        assert z.read("vllm-1.dist-info/RECORD").decode().splitlines() == [
            "vllm/__init__.py,sha256=x,0", f"{member},sha256={digest},7", "RECORD,,"
        ]  # fmt: skip
    assert out.name == wheel.name and zipfile.ZipFile(wheel).read(member) == b"old"


def test_vllm_0_33_0s_project_holds_its_moe_block_and_nothing_that_fetches(real_tree, tmp_path):
    text = (real_tree / "CMakeLists.txt").read_text()
    project = project_text(text, tmp_path)
    assert "FetchContent_Declare" not in project and "external_projects" not in project
    assert re.search(r"define_extension_target\(\s*_moe_C_stable_libtorch", project)
    assert not re.search(r"define_extension_target\(\s*_C_stable_libtorch", project)
    assert "generate_kernels.py" in project  # the Marlin MoE generator runs as vLLM's configure runs it


def test_vllm_0_33_0s_moe_sources_read_no_flag_the_skipped_statements_add(real_tree):
    """The module's claim: the _C block's ``list(APPEND VLLM_GPU_FLAGS -D...)`` never reach what the MoE target
    compiles, so the objects built without those statements are the same code."""
    text = (real_tree / "CMakeLists.txt").read_text()
    start = target_sources(text, MOE).block[0]
    skipped = [
        c for c in commands(text) if c.start < start and c.name == "list" and c.args[:2] == ("APPEND", "VLLM_GPU_FLAGS")
    ]
    macros = {m for c in skipped for a in c.args for m in re.findall(r"-D(\w+)", a)}
    assert "ENABLE_CUTLASS_MOE_SM90" in macros and "VLLM_ENABLE_COOPERATIVE_TOPK" in macros
    tree = DirTree(real_tree)
    moe = [p for p, t in moe_sources(tree).targets.items() if MOE in t]
    assert moe
    assert {(p, m) for p in moe for m in macros if m in (tree.read(p) or "")} == set()
