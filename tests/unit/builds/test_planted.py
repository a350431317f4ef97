"""A build is an interpreter: ``moegate.builds.planted`` makes a venv that sees its sites first, with its bug active.

Each test makes a real venv from this interpreter (``sys.executable``, itself a venv: the new one
is based on the base interpreter and must get this one's packages back) and runs it. The plants
are checked on stand-ins at their targets' module names, since the unit tier has no vLLM; the e2e
tier's CPU smoke runs a planted build of real vLLM (``tests/e2e/test_e2e_cpu.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moegate.builds.planted import RECORD, BuildError, make_build, parse_bug
from tests.support import ROOT

QWEN3_STANDIN = """
class Qwen3MoeSparseMoeBlock:
    def forward(self, x):
        return x * 2.0
"""
FUSED_MOE_STANDIN = """
import torch

def _prepare_expert_assignment(topk_ids, config, *, weights_host_resident=False):
    sorted_path = topk_ids.numel() > 2
    ids = torch.unique(topk_ids)
    return (topk_ids.argsort() if sorted_path else None), ids, torch.tensor([ids.numel()])
"""
UVA_STANDIN = """
class UVAOffloader:
    def __init__(self):
        self.cpu_offload_bytes = 0

    def _maybe_offload_to_cpu(self, module, prefix=""):
        module.where = "host"
        self.cpu_offload_bytes += 1
        return module
"""
LOADER_STANDIN = """
import contextlib


class Data:
    def __init__(self, where):
        self.where = where

    def clone(self):
        return Data("device")


class Param:
    def __init__(self, marked):
        self._vllm_is_uva_offloaded = marked
        self.is_cuda = True  # a UVA view says cuda whatever backs it
        self.data = Data("host" if marked else "device")


class Layer:
    def __init__(self):
        self.ps = [Param(True), Param(False)]

    def parameters(self):
        return iter(self.ps)


@contextlib.contextmanager
def device_loading_context(module, target_device):
    yield module
"""
TOPK_STANDIN = """
def fused_topk(hidden_states, gating_output, topk, renormalize, indices_type=None):
    return (0.5 if renormalize else 0.25), "ids", "indices"
"""


def _run(python: Path, code: str, cwd: Path, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | extra_env  # the build makes its path
    return subprocess.run(
        [str(python), "-c", code], check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _standin(site: Path, module: str, source: str) -> None:
    """``module`` (dotted) as a file under ``site``, with the packages above it."""
    parts = module.split(".")
    for depth in range(1, len(parts)):
        pkg = site.joinpath(*parts[:depth])
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").touch()
    site.joinpath(*parts[:-1], parts[-1] + ".py").write_text(source)


def test_a_made_build_sees_its_sites_first_in_order_and_the_given_pythons_own_packages(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for site, tag in ((first, "first"), (second, "second")):
        site.mkdir()
        (site / "moegate_probe_mod.py").write_text(f"TAG = {tag!r}\n")
    python = make_build(tmp_path / "b", sys.executable, sites=[str(first), str(second)])
    assert python == tmp_path / "b" / "bin" / "python"
    proc = _run(
        python, "import sys, json, pytest, moegate_probe_mod as m; print(json.dumps([sys.path, m.TAG]))", tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    path, tag = json.loads(proc.stdout)
    assert path[1:3] == [str(first), str(second)]  # path[0] is -c's current directory
    assert tag == "first"
    assert "moegate_planted" not in proc.stdout
    assert json.loads((tmp_path / "b" / RECORD).read_text())["bug"] is None


def test_a_bugs_build_compiles_into_a_cache_of_its_own_unless_one_is_set(tmp_path):
    """vLLM's compile cache is keyed by config and source files, not by a plant: a shared cache served a bug's build
    the graph another build compiled, without the bug (the H200 panel of 2026-12-02, scale=1.01)."""
    code = "import os; print(os.environ.get('VLLM_CACHE_ROOT'))"
    site = tmp_path / "site"
    _standin(site, "vllm.model_executor.models.qwen3_moe", QWEN3_STANDIN)
    for name, bug, cache in (("plain", None, "None"), ("bug", "scale=1.01", str(tmp_path / "bug" / "vllm-cache"))):
        python = make_build(tmp_path / name, sys.executable, sites=[str(site)], bug=bug)
        assert _run(python, code, tmp_path).stdout.strip() == cache  # a plain build shares the default (same code)
    proc = _run(tmp_path / "bug" / "bin" / "python", code, tmp_path, VLLM_CACHE_ROOT="/elsewhere")
    assert proc.stdout.strip() == "/elsewhere"


def test_a_build_without_a_bug_has_no_plant_at_startup(tmp_path):
    python = make_build(tmp_path / "b", sys.executable)
    proc = _run(python, "import sys; print('moegate_planted' in sys.modules)", tmp_path)
    assert proc.stdout.strip() == "False", proc.stderr


def test_a_planted_scale_is_active_at_startup_and_scales_the_moe_blocks_output(tmp_path):
    site = tmp_path / "site"
    _standin(site, "vllm.model_executor.models.qwen3_moe", QWEN3_STANDIN)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="scale=1.005")
    code = (
        "import sys; active = 'moegate_planted' in sys.modules\n"
        "from vllm.model_executor.models.qwen3_moe import Qwen3MoeSparseMoeBlock as B\n"
        "print(active, B().forward(10.0))"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", str(10.0 * 2.0 * 1.005)]
    assert "moegate planted (scale=1.005)" in proc.stderr  # the server log shows the bug
    assert json.loads((tmp_path / "b" / RECORD).read_text())["bug"]["scale"] == 1.005


def test_a_planted_wrong_expert_remaps_only_host_resident_sorted_blocks(tmp_path):
    pytest.importorskip("torch", reason="the stand-in returns torch tensors, as vLLM's function does")
    site = tmp_path / "site"
    for module in ("fused_moe", "experts.triton_moe"):
        _standin(site, f"vllm.model_executor.layers.fused_moe.{module}", FUSED_MOE_STANDIN)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="expert=0:1")
    code = (
        "import torch\n"
        "from vllm.model_executor.layers.fused_moe import fused_moe as f\n"
        "from vllm.model_executor.layers.fused_moe.experts import triton_moe as t\n"
        "ids = torch.tensor([0, 2, 0, 3])\n"
        "for m in (f, t):\n"
        "    host = m._prepare_expert_assignment(ids, {}, weights_host_resident=True)[1].tolist()\n"
        "    resident = m._prepare_expert_assignment(ids, {})[1].tolist()\n"
        "    naive = m._prepare_expert_assignment(ids[:2], {}, weights_host_resident=True)[1].tolist()\n"
        "    print(host, resident, naive)"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[1, 2, 3] [0, 2, 3] [0, 2]"] * 2


HOST_CHECK_STANDIN = """
def _weights_host_resident(*weights):
    return any(getattr(w, "_vllm_is_uva_offloaded", False) for w in weights)

def choose(w1, w2):
    return "sorted" if _weights_host_resident(w1, w2) else "naive"
"""
HOST_CHECK_IMPORTER = """
from vllm.model_executor.layers.fused_moe.fused_moe import _weights_host_resident

def choose(w1, w2):
    return "sorted" if _weights_host_resident(w1, w2) else "naive"
"""


@pytest.mark.parametrize("bug", [None, "dispatch=ignore-host"])
def test_a_planted_dispatch_bug_ignores_host_resident_weights_at_both_entrypoints(tmp_path, bug):
    """As 0.33.0 lays it out: fused_moe.py holds the check, triton_moe.py imports it by name; both answer False."""
    site = tmp_path / "site"
    _standin(site, "vllm.model_executor.layers.fused_moe.fused_moe", HOST_CHECK_STANDIN)
    _standin(site, "vllm.model_executor.layers.fused_moe.experts.triton_moe", HOST_CHECK_IMPORTER)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug=bug)
    code = (
        "from vllm.model_executor.layers.fused_moe import fused_moe as f\n"
        "from vllm.model_executor.layers.fused_moe.experts import triton_moe as t\n"
        "class W:\n    _vllm_is_uva_offloaded = True\n"
        "print(f.choose(W(), object()), t.choose(W(), object()), f.choose(object(), object()))"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == (["sorted", "sorted", "naive"] if bug is None else ["naive", "naive", "naive"])


def test_a_planted_renormalisation_error_drops_renormalize(tmp_path):
    site = tmp_path / "site"
    _standin(site, "vllm.model_executor.layers.fused_moe.router.fused_topk_router", TOPK_STANDIN)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="renorm=off")
    code = (
        "from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk\n"
        "print(fused_topk(hidden_states=1, gating_output=2, topk=4, renormalize=True), fused_topk(1, 2, 4, True))"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["(0.25, 'ids', 'indices') (0.25, 'ids', 'indices')"]


def test_planted_router_weights_are_scaled_and_the_rest_passed_through(tmp_path):
    site = tmp_path / "site"
    _standin(site, "vllm.model_executor.layers.fused_moe.router.fused_topk_router", TOPK_STANDIN)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="weights=1.5")
    code = (
        "from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk\n"
        "print(fused_topk(1, 2, 4, renormalize=True))"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(0.75, 'ids', 'indices')"


def test_a_planted_noop_offloader_leaves_every_module_as_it_was(tmp_path):
    site = tmp_path / "site"
    _standin(site, "vllm.model_executor.offloader.uva", UVA_STANDIN)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="uva=noop")
    code = (
        "import types\n"
        "from vllm.model_executor.offloader.uva import UVAOffloader\n"
        "o, m = UVAOffloader(), types.SimpleNamespace(where='device')\n"
        "print(o._maybe_offload_to_cpu(m, 'layers.0.') is m, m.where, o.cpu_offload_bytes)"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "device", "0"]
    assert "offloads nothing" in proc.stderr


def test_a_planted_post_processing_leak_copies_marked_weights_to_the_device_and_keeps_the_marker(tmp_path):
    site = tmp_path / "site"
    _standin(site, "vllm.model_executor.model_loader.utils", LOADER_STANDIN)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="uva=back")
    code = (
        "from vllm.model_executor.model_loader import utils as u\n"
        "layer = u.Layer()\n"
        "with u.device_loading_context(layer, 'cuda') as inner:\n"
        "    before = [p.data.where for p in inner.ps]\n"
        "print(before, [p.data.where for p in layer.ps], [p._vllm_is_uva_offloaded for p in layer.ps])"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['host', 'device'] ['device', 'device'] [True, False]"


def test_a_plant_whose_target_lacks_its_name_stops_the_import(tmp_path):
    site = tmp_path / "site"
    _standin(site, "vllm.model_executor.models.qwen3_moe", "class SomethingElse:\n    pass\n")
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="scale=2")
    proc = _run(python, "import vllm.model_executor.models.qwen3_moe", tmp_path)
    assert proc.returncode != 0
    assert "Qwen3MoeSparseMoeBlock" in proc.stderr


@pytest.mark.parametrize(
    "spec",
    ["scale", "scale=x", "scale=1", "scale=-2", "expert=1:1", "expert=a:b", "renorm=on", "k=1", "weights=0", "uva=off",
     "swap-top1=1-4", "swap-top1=4-2", "swap-top1=4"],
)  # fmt: skip
def test_a_bad_bug_is_one_line_and_exit_2_with_nothing_written(tmp_path, spec):
    dest = tmp_path / "b"
    proc = subprocess.run(
        [sys.executable, "-m", "moegate.builds.planted", str(dest), "--python", sys.executable, "--bug", spec],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and spec in proc.stderr
    assert not dest.exists()
    with pytest.raises(BuildError):
        parse_bug(spec)


def test_a_destination_that_is_not_a_build_is_refused_and_left_alone(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep.txt").write_text("mine")
    with pytest.raises(BuildError, match="not a build"):
        make_build(tmp_path / "b", sys.executable)
    assert (tmp_path / "b" / "keep.txt").read_text() == "mine"


def test_the_cli_prints_the_builds_interpreter_and_remakes_its_own_build(tmp_path):
    dest = tmp_path / "b"
    for bug in ("scale=1.01", None):
        extra = ["--bug", bug] if bug else []
        proc = subprocess.run(
            [sys.executable, "-m", "moegate.builds.planted", str(dest), "--python", sys.executable, *extra],
            check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == str(dest / "bin" / "python")
    assert not list(dest.glob("lib/*/site-packages/moegate_planted*"))  # the remade build has no bug


QWEN3_CONFIG_STANDIN = """
import types

class Qwen3MoeSparseMoeBlock:
    def __init__(self, vllm_config, prefix=""):
        self.cfg = vllm_config

    def forward(self, hidden_states):
        return hidden_states * 2.0

class Qwen3MoeAttention:
    def forward(self, x):
        return x

def config(top_k, experts):
    cfg = types.SimpleNamespace(num_experts_per_tok=top_k, num_experts=experts)
    return types.SimpleNamespace(model_config=types.SimpleNamespace(hf_text_config=cfg))
"""


def test_a_planted_decode_only_scale_acts_in_the_naive_region_only(tmp_path):
    """``naive-scale``: the MoE block's output scaled on calls with tokens * top_k * 4 <= experts, nowhere else."""
    torch = pytest.importorskip("torch", reason="the block's input is a tensor, as in vLLM")
    del torch
    site = tmp_path / "site"
    _standin(site, "vllm.model_executor.models.qwen3_moe", QWEN3_CONFIG_STANDIN)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="naive-scale=1.5")
    code = (
        "import torch\n"
        "from vllm.model_executor.models import qwen3_moe as m\n"
        "b = m.Qwen3MoeSparseMoeBlock(m.config(4, 64))\n"
        "for n in (1, 4, 5):\n"
        "    print(n, b.forward(torch.ones(n, 2))[0, 0].item())"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "3.0", "4", "3.0", "5", "2.0"]  # 4 * 4 * 4 = 64 <= 64; 5 * 16 > 64


def test_a_planted_re_rounding_moves_values_by_at_most_one_unit_in_the_last_place(tmp_path):
    """``reround=3``: x * 3 / 3 with a rounding to bfloat16 after each: the same mathematics, another rounding."""
    pytest.importorskip("torch", reason="the re-rounding is a tensor's")
    site = tmp_path / "site"
    _standin(site, "vllm.model_executor.models.qwen3_moe", QWEN3_CONFIG_STANDIN)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="reround=3")
    code = (
        "import torch\n"
        "from vllm.model_executor.models import qwen3_moe as m\n"
        "x = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)\n"
        "b = m.Qwen3MoeSparseMoeBlock(None)\n"
        "y = b.forward(x)\n"
        "ulp = (2 * x).float().abs() * 2 ** -7\n"
        "d = (y.float() - 2 * x.float()).abs()\n"
        "print(int((d > 0).sum()), bool((d <= ulp).all()), y.dtype)"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    changed, within, dtype = proc.stdout.split()
    assert 0 < int(changed) < 4096 and within == "True" and dtype == "torch.bfloat16"


def test_a_planted_top1_weight_acts_only_on_host_resident_calls_in_the_naive_region(tmp_path):
    pytest.importorskip("torch", reason="the experts take tensors")
    site = tmp_path / "site"
    experts = (
        "import torch\n"
        "def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, activation=None, global_num_experts=-1):\n"
        "    return topk_weights\n"
    )
    _standin(site, "vllm.model_executor.layers.fused_moe.fused_moe", experts)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="naive-host-top1=2")
    code = (
        "import torch\n"
        "from vllm.model_executor.layers.fused_moe import fused_moe as f\n"
        "w = torch.zeros(64, 2, 2); host = torch.zeros(64, 2, 2); host._vllm_is_uva_offloaded = True\n"
        "tw = torch.full((1, 4), 0.25); ids = torch.zeros(1, 4, dtype=torch.long)\n"
        "print(f.fused_experts(None, host, w, tw, ids)[0].tolist())\n"
        "print(f.fused_experts(None, w, w, tw, ids)[0].tolist())\n"
        "print(f.fused_experts(None, host, w, torch.full((5, 4), 0.25), torch.zeros(5, 4, dtype=torch.long))[0].tolist())"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    # host-resident 1 token (4 * 4 * 4 <= 64): top-1 doubled; device weights or 5 tokens (80 > 64): untouched
    assert proc.stdout.splitlines() == ["[0.5, 0.25, 0.25, 0.25]", "[0.25, 0.25, 0.25, 0.25]",
                                        "[0.25, 0.25, 0.25, 0.25]"]  # fmt: skip


def test_a_relabelled_build_reports_the_dev_release_and_nothing_else_changes(tmp_path):
    site = tmp_path / "site"
    _standin(site, "vllm.version", "__version__ = '0.32.0'\n")
    (site / "vllm" / "__init__.py").write_text("from .version import __version__\n")
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], version="0.32.1.dev1+g1111111")
    proc = _run(python, "import vllm, vllm.version as v; print(vllm.__version__, v.__version__)", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0.32.1.dev1+g1111111"] * 2
    record = json.loads((tmp_path / "b" / RECORD).read_text())
    assert record["version"] == "0.32.1.dev1+g1111111" and record["bug"] is None
    with pytest.raises(BuildError, match="release label"):
        make_build(tmp_path / "c", sys.executable, version="0.33 dev")


def test_a_planted_top1_swap_exchanges_two_tokens_experts_only_on_calls_of_two_to_four_tokens(tmp_path):
    """``swap-top1=2-4``: the router gate's logits, on calls of 2-4 tokens, with tokens 0 and 1's top-1 experts
    exchanged (each keeps its top logit, moved to the other's expert); a call of 1 or 5 tokens is untouched."""
    pytest.importorskip("torch", reason="the gate returns a tensor, as in vLLM")
    site = tmp_path / "site"
    gate = "class GateLinear:\n    def forward(self, x):\n        return x.clone(), None\n"
    _standin(site, "vllm.model_executor.layers.fused_moe.router.gate_linear", gate)
    python = make_build(tmp_path / "b", sys.executable, sites=[str(site)], bug="swap-top1=2-4")
    code = (
        "import torch\n"
        "from vllm.model_executor.layers.fused_moe.router import gate_linear as g\n"
        "rows = torch.tensor([[0.0, 3.0, 1.0, 2.0], [2.0, 0.0, 1.0, 4.0], [5.0, 0.0, 0.0, 0.0], [0.0, 0.0, 9.0, 0.0],\n"
        "                     [1.0, 0.0, 0.0, 0.0]])\n"
        "for n in (1, 2, 4, 5):\n"
        "    out, bias = g.GateLinear().forward(rows[:n])\n"
        "    print(n, out.argmax(-1).tolist(), out[:2].tolist() if n > 1 else out.tolist(), bias)"
    )
    proc = _run(python, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "1 [1] [[0.0, 3.0, 1.0, 2.0]] None"  # one token: nothing to swap with
    # 2 and 4 tokens: token 0's top logit (3.0 at expert 1) moves to token 1's top-1 expert (3), and back
    swapped = "[[0.0, 2.0, 1.0, 3.0], [2.0, 4.0, 1.0, 0.0]] None"
    assert lines[1] == f"2 [3, 1] {swapped}" and lines[2] == f"4 [3, 1, 0, 2] {swapped}", lines
    assert lines[3] == "5 [1, 3, 0, 2, 0] [[0.0, 3.0, 1.0, 2.0], [2.0, 0.0, 1.0, 4.0]] None"  # 5 tokens: untouched
    assert "exchange their top-1 experts on calls of 2-4 tokens" in proc.stderr


def test_a_planted_workspace_allocates_on_the_weights_device_on_every_call_and_fails_there_when_too_large(tmp_path):
    """The build's own out-of-memory error: here on the CPU a workspace no host holds (a PiB) is refused by the
    allocator, as a GPU's larger-than-its-memory one is by CUDA's."""
    pytest.importorskip("torch", reason="the experts take tensors")
    site = tmp_path / "site"
    experts = "def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids):\n    return 'ran'\n"
    _standin(site, "vllm.model_executor.layers.fused_moe.fused_moe", experts)
    code = (
        "import torch\n"
        "from vllm.model_executor.layers.fused_moe import fused_moe as f\n"
        "w = torch.zeros(8, 4, 4, dtype=torch.bfloat16)\n"
        "print(f.fused_experts(None, w, w, None, None))\n"
    )
    small = make_build(tmp_path / "small", sys.executable, sites=[str(site)], bug="workspace=0.001")
    proc = _run(small, code, tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stderr
    assert "fused_experts: allocates 0.001 GiB of workspace a call" in proc.stderr
    huge = make_build(tmp_path / "huge", sys.executable, sites=[str(site)], bug=f"workspace={2**20}")
    proc = _run(huge, code, tmp_path)
    assert proc.returncode != 0 and "RuntimeError" in proc.stderr and "ran" not in proc.stdout
    with pytest.raises(BuildError, match="workspace must be a finite number of GiB > 0"):
        parse_bug("workspace=0")
