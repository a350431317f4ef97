"""The paths a CI's filter watches (moegate/census/watch.py), read from a census: every file it names, the
folders it reads whole, the compiled aligners; ``moegate census paths`` prints them."""

from __future__ import annotations

import subprocess
import sys

from moegate.census import census, watch
from tests.support import ROOT


def test_every_file_the_census_names_is_watched_under_vllms_tree():
    records = census.parse_golden(watch.newest_golden().read_text())
    watched = watch.golden_paths()
    assert watched == sorted(set(watched))
    for rec in records:
        if "file" in rec:
            path = f"vllm/{rec['file']}"
            assert path in watched or any(path.startswith(f) for f in watched if f.endswith("/")), path
    assert watched[:2] == ["csrc/moe/", "vllm/model_executor/layers/fused_moe/"]
    assert "vllm/model_executor/models/registry.py" in watched and "vllm/transformers_utils/configs/" in watched


def test_a_file_inside_a_watched_folder_is_not_named_again():
    records = [
        {"kind": "site", "file": "model_executor/layers/fused_moe/fused_moe.py"},
        {"kind": "layer", "file": "model_executor/models/qwen3_moe.py"},
        {"kind": "layer", "file": "model_executor/models/qwen3_moe.py"},
        {"kind": "tuned"},
    ]
    assert watch.watched_paths(records) == [
        "csrc/moe/",
        "vllm/model_executor/layers/fused_moe/",
        "vllm/model_executor/model_loader/utils.py",
        "vllm/model_executor/models/qwen3_moe.py",
        "vllm/model_executor/models/registry.py",
        "vllm/model_executor/offloader/",
        "vllm/transformers_utils/configs/",
    ]


def test_moegate_census_paths_prints_them_one_a_line_and_a_bad_golden_in_one():
    cmd = [sys.executable, "-m", "moegate", "census", "paths"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.splitlines() == watch.golden_paths()
    bad = subprocess.run([*cmd, "--golden", "README.md"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stdout == "" and len(bad.stderr.splitlines()) == 1
    assert bad.stderr.startswith("moegate census paths: README.md: not a census golden")
