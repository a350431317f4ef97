"""The reach report's two vLLM-facing parts against the installed vLLM and Triton, on any machine.

The specialisation recorder is handed what Triton hands its ``jit_cache_hook`` for vLLM's own fused-MoE kernel:
Triton's ``JITFunction._call_hook`` builds the hook's arguments from a specialisation exactly as a compilation
would (a CPU cannot compile), so the record is read from Triton's real plumbing. The layout check runs on a copy
of the installed vLLM's tree with a module taken out: the reach run names it and stops.
"""

from __future__ import annotations

import inspect
import os
import shutil
import types
from pathlib import Path
from typing import Any

import pytest

from moegate.census.source import locate
from moegate.reach import layout
from moegate.reach.__main__ import main as reach_main
from moegate.reach.specialisations import TUNING, Specialisation, record

triton = pytest.importorskip("triton", reason="the recorder hooks Triton, which this vLLM build lacks")


def _compile_hook_call(jit: object, hook: object, values: dict[str, object], divisible: set[str]) -> None:
    """Call ``hook`` as Triton 3.x does before compiling ``jit`` with these constexpr values and divisibility."""
    params = jit.params  # type: ignore[attr-defined]
    constants = {(p.num,): values[p.name] for p in params if p.name in values}
    attrs = {(p.num,): [["tt.divisibility", 16]] if p.name in divisible else [] for p in params if p.name not in values}
    signature = {p.name: ("constexpr" if p.name in values else "*bf16" if p.name.endswith("_ptr") else "i32")
                 for p in params}  # fmt: skip
    options = types.SimpleNamespace(num_warps=4, num_ctas=1, num_stages=3, enable_fp_fusion=True,
                                    launch_cooperative_grid=False, extern_libs=None)  # fmt: skip
    key = (tuple(signature.values()), tuple(signature.values()))
    given = {"hook": hook, "key": key, "signature": signature, "device": 0, "constants": constants,
             "options": options, "configs": [attrs], "is_warmup": False,
             "target": types.SimpleNamespace(backend="cuda", arch=90, warp_size=32)}  # fmt: skip
    wanted = inspect.signature(jit._call_hook).parameters  # type: ignore[attr-defined]
    jit._call_hook(**{k: v for k, v in given.items() if k in wanted})  # type: ignore[attr-defined]


def _placeholder(annotation: object) -> bool:
    return "Placeholder" in getattr(annotation, "__qualname__", "")


def tritons(kernel: Any) -> Any:
    """vLLM's kernel as Triton's JITFunction: on a GPU it is one; on a CPU vLLM's placeholder ``triton.jit`` left the
    bare function, whose ``tl.constexpr`` annotations are the placeholder's, so they are swapped for Triton's own."""
    if hasattr(kernel, "params"):
        return kernel
    fn = types.FunctionType(kernel.__code__, kernel.__globals__, kernel.__name__, kernel.__defaults__)
    fn.__kwdefaults__ = kernel.__kwdefaults__
    fn.__qualname__, fn.__module__ = kernel.__qualname__, kernel.__module__
    annotations = kernel.__annotations__.items()
    fn.__annotations__ = {k: triton.language.constexpr if _placeholder(v) else v for k, v in annotations}
    return triton.jit(fn)


def test_the_recorder_notes_a_vllm_kernels_behaviour_flags_and_divisibility_and_leaves_out_its_tuning(target):
    kernel = tritons(target.fm.fused_moe_kernel)
    root = locate().root
    values = {"HAS_BIAS": True, "MUL_ROUTED_WEIGHT": False, "naive_block_assignment": True, "BLOCK_SIZE_M": 16,
              "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "SPLIT_K": 1, "use_fp8_w8a8": False,
              "compute_type": triton.language.bfloat16, "stride_cn": 1}  # fmt: skip
    seen: list[Specialisation] = []
    errors: list[str] = []
    # a reach run's own recorder (moegate.reach.plugin) may be the hook now: this made-up variant must not reach it
    outer, triton.knobs.runtime.jit_cache_hook = triton.knobs.runtime.jit_cache_hook, None
    try:
        with record(seen, root, errors) as hooked:
            assert hooked
            _compile_hook_call(kernel, triton.knobs.runtime.jit_cache_hook, values, {"K", "stride_am"})
        assert triton.knobs.runtime.jit_cache_hook is None  # put back as found
    finally:
        triton.knobs.runtime.jit_cache_hook = outer
    assert errors == [] and len(seen) == 1
    (spec,) = seen
    assert spec.kernel == f"{layout.PACKAGE}/fused_moe.py::fused_moe_kernel"
    flags = dict(spec.flags)
    assert flags["HAS_BIAS"] is True and flags["naive_block_assignment"] is True and flags["compute_type"] == "bf16"
    assert not TUNING & set(flags), "tile sizes are tuning, not behaviour"
    assert spec.divisible == ("K", "stride_am") and spec.ones == ("stride_cn",)
    assert dict(spec.types)["a_ptr"] == "*bf16"


@pytest.fixture(scope="module")
def vllm_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The installed vLLM's ``.py`` files, linked into a tree of real folders (nothing written through a link)."""
    dest = tmp_path_factory.mktemp("vllm-reach") / "vllm"

    def ignore(folder: str, entries: list[str]) -> set[str]:
        return {e for e in entries if not (e.endswith(".py") or (Path(folder) / e).is_dir())} | {"__pycache__"}

    shutil.copytree(locate().root, dest, ignore=ignore, copy_function=os.symlink)
    return dest


def test_the_installed_vllms_layout_is_one_the_report_knows(vllm_copy):
    lay = layout.read(vllm_copy)
    assert f"{layout.PACKAGE}/fused_moe.py::fused_moe_kernel" in lay.triton
    assert "moe_align_block_size" in lay.helper_scopes["_custom_ops.py"]


def test_a_reach_run_against_a_vllm_whose_layout_it_does_not_know_names_the_missing_module(vllm_copy, tmp_path, capsys):
    moved = vllm_copy / layout.PACKAGE / "experts" / "triton_moe.py"
    moved.rename(moved.with_suffix(".moved"))
    try:
        status = reach_main(["run", "--vllm-root", str(vllm_copy), "--out", str(tmp_path / "out")])
    finally:
        moved.with_suffix(".moved").rename(moved)
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert "no module vllm.model_executor.layers.fused_moe.experts.triton_moe " in err and "\n" not in err
    assert not (tmp_path / "out").exists()  # nothing run, nothing written
