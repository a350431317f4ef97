"""A Triton kernel's name in the reach record: its file relative to the vllm folder, whatever links lie between."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from moegate.reach.specialisations import _kernel_name


def _jit(file: Path, module: str) -> SimpleNamespace:
    code = compile("def fused_moe_kernel():\n    pass\n", str(file), "exec")
    ns: dict[str, object] = {}
    exec(code, ns)  # noqa: S102 - a function whose code names the file
    return SimpleNamespace(fn=ns["fused_moe_kernel"], module=module)


def test_a_kernel_in_a_mirror_whose_files_link_elsewhere_is_named_by_its_path_in_vllm(tmp_path):
    """The corpus's builds see a mirror of the vllm package (real folders, linked files): on the H100 the name fell back
    to the module's dotted form and the dispatch tier's recorder test failed the unplanted baseline."""
    site = tmp_path / "site" / "vllm" / "model_executor"
    site.mkdir(parents=True)
    (site / "fused_moe.py").write_text("")
    mirror = tmp_path / "mirror" / "vllm" / "model_executor"
    mirror.mkdir(parents=True)
    os.symlink(site / "fused_moe.py", mirror / "fused_moe.py")
    jit = _jit(mirror / "fused_moe.py", "vllm.model_executor.fused_moe")
    assert _kernel_name(jit, "k", tmp_path / "mirror" / "vllm") == "model_executor/fused_moe.py::fused_moe_kernel"
    elsewhere = _jit(tmp_path / "other.py", "vllm.model_executor.fused_moe")
    assert _kernel_name(elsewhere, "k", tmp_path / "mirror" / "vllm") == "model_executor/fused_moe.py::fused_moe_kernel"
    outside = _jit(tmp_path / "other.py", "triton.tools")
    assert _kernel_name(outside, "k", tmp_path / "mirror" / "vllm") == "triton.tools::fused_moe_kernel"
