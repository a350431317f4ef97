"""The paths that reach the fused MoE (tooling/ci/moe_paths.py): generated from the census, never kept by hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import ROOT
from tooling.ci import moe_paths
from tooling.ci.moe_paths import PathsError, generate, newest_census, reaching, read_list, render


def test_the_committed_list_is_what_the_newest_census_gives():
    census = newest_census()
    assert moe_paths.LIST.read_text() == render(census, generate(census)), "python -m tooling.ci.moe_paths --write"
    proc = subprocess.run(
        [sys.executable, "-m", "tooling.ci.moe_paths", "--check"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_the_list_holds_the_five_kinds_of_path_the_issue_names():
    listed = read_list()
    assert "vllm/model_executor/layers/fused_moe/" in listed  # the fused-MoE package
    assert "csrc/moe/" in listed  # the MoE CUDA sources
    assert "vllm/model_executor/models/qwen3_moe.py" in listed  # a MoE model file
    assert "vllm/model_executor/offloader/" in listed  # the offloader
    assert "vllm/model_executor/layers/quantization/fp8.py" in listed  # a MoE quantization method
    assert "vllm/model_executor/models/llama.py" not in listed and "csrc/attention/" not in listed
    assert not [p for p in listed if p.startswith("vllm/model_executor/layers/fused_moe/") and not p.endswith("/")]


def test_a_census_line_changes_the_generated_list(tmp_path):
    census = newest_census()
    added = tmp_path / census.name
    line = {"kind": "layer", "file": "model_executor/models/new_moe_model.py", "scope": "X.__init__"}
    added.write_text(census.read_text() + json.dumps(line) + "\n")
    assert set(generate(added)) - set(generate(census)) == {"vllm/model_executor/models/new_moe_model.py"}
    proc = subprocess.run([sys.executable, "-m", "tooling.ci.moe_paths", "--check", "--census", str(added)],
                          cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 1 and "python -m tooling.ci.moe_paths --write" in proc.stderr


def test_a_census_without_the_builder_or_not_json_is_one_line(tmp_path):
    empty = tmp_path / "vllm-9.9.9.jsonl"
    empty.write_text("# header\n" + json.dumps({"kind": "layer", "file": "model_executor/models/x.py"}) + "\n")
    with pytest.raises(PathsError, match="no builder record"):
        generate(empty)
    empty.write_text("{not json\n")
    with pytest.raises(PathsError, match=r"vllm-9.9.9.jsonl: not a census"):
        generate(empty)
    with pytest.raises(PathsError, match="no census in"):
        newest_census(tmp_path / "none")


def test_a_path_reaches_the_fused_moe_when_it_is_listed_or_under_a_listed_folder():
    listed = ["csrc/moe/", "vllm/model_executor/models/qwen3_moe.py"]
    changed = ["csrc/moe/topk_softmax_kernels.cu", "csrc/moe_extra.cu", "vllm/model_executor/models/qwen3_moe.py",
               "vllm/model_executor/models/qwen3_moe.pyi", "docs/usage.md"]  # fmt: skip
    assert reaching(changed, listed) == ["csrc/moe/topk_softmax_kernels.cu", "vllm/model_executor/models/qwen3_moe.py"]


def test_match_writes_the_tiers_for_the_callers_changes_job(tmp_path):
    out = tmp_path / "github_output"
    env = {**os.environ, "GITHUB_OUTPUT": str(out)}

    def match(changed: str) -> str:
        out.write_text("")
        subprocess.run([sys.executable, "-m", "tooling.ci.moe_paths", "match", "--github-output"], input=changed,
                       cwd=ROOT, env=env, check=True, capture_output=True, text=True)  # fmt: skip
        return out.read_text()

    assert match("docs/usage.md\nREADME.md\n") == "moe=false\ntiers=dispatch\n"
    assert match("docs/usage.md\ncsrc/moe/moe_align_sum_kernels.cu\n") == "moe=true\ntiers=dispatch,kernels,e2e,ab\n"
