"""A small vLLM-shaped tree for the reach report's tests: the layout ``moegate.reach.layout`` knows, a few lines each.

``fake_vllm(tmp)`` writes ``tmp/vllm`` with a version, every module the layout requires, one Triton kernel, a
helper module of which the package calls one function (and that function another), and returns the folder.
``coverage_report(root, functions)`` writes a coverage.py JSON report (format 3) over it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moegate.reach import layout

FUSED = """import triton


@triton.jit
def fused_moe_kernel(a, N, K, HAS_BIAS: "tl.constexpr"):
    pass


def fused_experts_impl(x, expert_map=None):
    if expert_map is not None:
        x = x + 1
    if is_rocm():
        x = x - 1
    return x
"""

HELPER = """def called_by_the_package(x):
    return called_by_the_helper(x)


def called_by_the_helper(x):
    if x:
        return 1
    return 0


def never_named(x):
    if x:
        return 2
    return 3
"""


def fake_vllm(tmp: Path, version: str = "9.9.9", drop: tuple[str, ...] = ()) -> Path:
    root = tmp / "vllm"
    files = {"__init__.py": "", "_version.py": f'__version__ = "{version}"\n', f"{layout.PACKAGE}/__init__.py": ""}
    for rel in layout.KNOWN:
        files[rel] = "from vllm._custom_ops import called_by_the_package\n"
    files[f"{layout.PACKAGE}/fused_moe.py"] = FUSED
    for rel in layout.HELPERS:
        files[rel] = HELPER if rel == "_custom_ops.py" else "def unused(x):\n    return x\n"
    for rel, text in files.items():
        if rel in drop:
            continue
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def coverage_report(root: Path, functions: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """A coverage.py JSON report: ``functions`` maps a file (relative to ``root``) to coverage's per-function data."""
    files = {}
    for rel, fns in functions.items():
        files[str(root / rel)] = {"functions": fns, "executed_lines": [], "missing_lines": []}
    return {"meta": {"format": 3, "version": "7.16.2", "branch_coverage": True}, "files": files}


def fn(executed: list[int], missing: list[int], taken: list[list[int]], untaken: list[list[int]]) -> dict[str, Any]:
    """coverage.py's data for one function."""
    return {
        "executed_lines": executed,
        "missing_lines": missing,
        "executed_branches": taken,
        "missing_branches": untaken,
    }
