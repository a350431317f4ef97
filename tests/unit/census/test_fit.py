"""``python -m moegate.census.fit`` tells "moegate no longer fits this vLLM" apart from a FAIL, before any case runs.

A stand-in ``vllm`` package on ``PYTHONPATH`` (a real process, a real import) plays a main branch that moved
things: the real build fits (``tests/dispatch/test_fit.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

FILES = {
    "vllm/__init__.py": '__version__ = "0.99.0.dev1+gabc"\n',
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/fused_moe/__init__.py": "",
    "vllm/model_executor/layers/fused_moe/fused_moe.py": (
        "def fused_experts(): ...\ndef fused_experts_impl(): ...\ndef _prepare_expert_assignment(): ...\n"
        "def moe_align_block_size(): ...\ndef dispatch_fused_moe_kernel(): ...\n"
    ),
    "vllm/model_executor/layers/fused_moe/experts/__init__.py": "",
    "vllm/model_executor/layers/fused_moe/experts/triton_moe.py": "class TritonExperts: ...\n",
    "vllm/model_executor/layers/fused_moe/config.py": "",
    "vllm/model_executor/offloader/__init__.py": "",
    "vllm/model_executor/offloader/uva.py": "class UVAOffloader: ...\n",
    "vllm/model_executor/model_loader/__init__.py": "",
    "vllm/model_executor/model_loader/utils.py": "def device_loading_context(): ...\n",
}


def _site(tmp_path: Path, **changed: str | None) -> Path:
    site = tmp_path / "site"
    for rel, text in {**FILES, **changed}.items():
        if text is not None:
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_text(text)
    return site


def _fit(site: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "fit.json"
    proc = subprocess.run(
        [sys.executable, "-m", "moegate.census.fit", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
        check=False, env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"},
    )  # fmt: skip
    return proc, json.loads(out.read_text())


def test_a_renamed_decision_and_a_moved_offloader_read_as_no_longer_fitting(tmp_path):
    fused = FILES["vllm/model_executor/layers/fused_moe/fused_moe.py"].replace("_prepare_expert_assignment", "_choose")
    site = _site(tmp_path, **{"vllm/model_executor/layers/fused_moe/fused_moe.py": fused,
                              "vllm/model_executor/offloader/uva.py": None})  # fmt: skip
    proc, result = _fit(site, tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == "moegate no longer fits vLLM 0.99.0.dev1+gabc:"
    moved = result["moved"]
    assert (
        "vllm.model_executor.layers.fused_moe.fused_moe._prepare_expert_assignment is gone: renamed or moved"
        in moved[1]
    )
    assert moved[0].startswith("module vllm.model_executor.offloader.uva does not import (ModuleNotFoundError: ")
    assert any(line.startswith("the census ") for line in moved)  # the stand-in has no layer builder to read
    assert result["fits"] is False and result["version"] == "0.99.0.dev1+gabc"


def test_a_vllm_that_does_not_import_is_named_so(tmp_path):
    site = _site(tmp_path, **{"vllm/__init__.py": "raise ImportError('libcudart.so.13: cannot open shared object')\n"})
    proc, result = _fit(site, tmp_path)
    assert proc.returncode == 3
    assert result["moved"] == ["vLLM does not import here: ImportError: libcudart.so.13: cannot open shared object"]
