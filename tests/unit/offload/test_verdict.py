"""Offload truth's rules on observations built here: each lie about where a weight lives is a FAIL naming the layer, the parameter and where it is.

The observations have the shape ``moegate.offload.residency.observe`` returns from a loaded model (what the
driver said per parameter); the GPU runs (``moegate offload-truth``) feed real ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moegate.offload.residency import layer_of, selected
from moegate.offload.verdict import Budget, expected_host, judge, min_block, pinned_allowance, pow2ceil

W13, W2 = 16 << 20, 8 << 20  # the default tiny model's bf16 expert tensors: powers of two
AMPLE = Budget.from_gb(64, ["experts"])
CALIBRATION = [{"request": 1, "range_size": 4096}, {"request": 4097, "range_size": 8192}]


_SLOTS: dict[str, int] = {}


def param(name: str, nbytes: int, *, memory: str, marked: bool, **extra: Any) -> dict[str, Any]:
    # a slot of its own per name (str's hash is salted per process: 1000 slots by hash let two weights share one
    # range now and then, and the held bytes came out short: a test command of 2026-12-02 failed so)
    base = 0x7F00_0000_0000 + _SLOTS.setdefault(name, len(_SLOTS)) * (64 << 20)
    return {
        "name": name,
        "layer": layer_of(name),
        "selected": selected(name, ["experts"]),
        "marked": marked,
        "nbytes": nbytes,
        "dtype": "bfloat16",
        "memory": memory,
        "gpu": 0 if memory == "device" else None,
        "range_start": base if memory == "host" else 0,
        "range_size": pow2ceil(nbytes) if memory == "host" else 0,
        **extra,
    }


def model(host: set[str] | None = None, layers: int = 2, marked: set[str] | None = None) -> list[dict]:
    """An attention weight and the two expert weights per layer; ``host`` (per layer, default both) in host memory, marked."""
    host = {"w13", "w2"} if host is None else host
    marked = host if marked is None else marked
    out = [param("model.embed_tokens.weight", 1 << 18, memory="device", marked=False)]
    for i in range(layers):
        out.append(param(f"model.layers.{i}.self_attn.qkv_proj.weight", 1 << 18, memory="device", marked=False))
        for w, n in (("w13", W13), ("w2", W2)):
            name = f"model.layers.{i}.mlp.experts.{w}_weight"
            out.append(param(name, n, memory="host" if w in host else "device", marked=w in marked))
    return out


def observation(params: list[dict], accounted: int | None = None) -> dict[str, Any]:
    if accounted is None:
        accounted = sum(p["nbytes"] for p in params if p["marked"])
    return {"params": params, "offloader": {"class": "UVAOffloader", "cpu_offload_bytes": accounted}}


def rules(v) -> list[str]:
    return sorted({f.rule for f in v.findings})


def test_every_expert_weight_on_the_host_and_marked_passes_with_its_bytes():
    v = judge(observation(model()), AMPLE, CALIBRATION)
    assert v.passed and v.label == "PASS", v.findings
    f = v.figures
    assert (f["host_bytes"], f["device_bytes"], f["expected_host_bytes"]) == (2 * (W13 + W2), 0, 2 * (W13 + W2))
    assert f["pinned"]["held_bytes"] == f["pinned"]["weight_bytes"] == 2 * (W13 + W2)
    assert f["pinned"]["overhead_ratio"] == 1.0
    assert [p["param"] for p in v.layers[0]] == ["w13_weight", "w2_weight"]


def test_a_marked_weight_in_device_memory_fails_naming_its_layer_parameter_and_gpu():
    params = model()
    params[-1] = param("model.layers.1.mlp.experts.w2_weight", W2, memory="device", marked=True)
    v = judge(observation(params), AMPLE, CALIBRATION)
    assert not v.passed and rules(v) == ["accounting", "budget", "marked-not-host"]
    marked = next(f for f in v.findings if f.rule == "marked-not-host")
    assert (marked.layer, marked.param) == (1, "model.layers.1.mlp.experts.w2_weight")
    assert marked.message == (
        "layer 1 model.layers.1.mlp.experts.w2_weight: marked host-resident (_vllm_is_uva_offloaded) "
        "but lives in device memory (GPU 0)"
    )


def test_host_memory_without_the_marker_fails_because_dispatch_would_take_it_for_device_memory():
    v = judge(observation(model(marked={"w13"}), accounted=2 * (W13 + W2)), AMPLE, CALIBRATION)
    assert rules(v) == ["host-not-marked"]
    assert all("w2_weight" in f.param for f in v.findings) and len(v.findings) == 2


def test_an_offload_that_silently_does_nothing_fails_on_the_budget():
    v = judge(observation(model(host=set()), accounted=0), AMPLE, CALIBRATION)
    assert rules(v) == ["budget"] and len(v.findings) == 4
    assert v.findings[0].message.startswith(
        "layer 0 model.layers.0.mlp.experts.w13_weight: the budget (64 GiB of experts) asks for it on the host"
    )
    assert v.figures["host_bytes"] == 0 and v.figures["device_bytes"] == 2 * (W13 + W2)


def test_without_offload_nothing_is_expected_on_the_host_and_everything_in_device_memory_passes():
    params = [dict(p, selected=False) for p in model(host=set())]
    assert judge(observation(params, accounted=None), Budget(0, ()), CALIBRATION).passed
    params[2] = dict(params[2], memory="host", range_start=1 << 40, range_size=W13)
    assert rules(judge(observation(params, accounted=None), Budget(0, ()), CALIBRATION)) == [
        "budget",
        "host-not-marked",
    ]


def test_a_budget_of_one_w13_expects_layer_0s_w13_alone_on_the_host():
    budget = Budget.from_gb(W13 / (1 << 30), ["experts"])
    params = model()
    assert expected_host(params, budget) == {"model.layers.0.mlp.experts.w13_weight"}
    assert rules(judge(observation(params), budget, CALIBRATION)) == ["budget"]  # everything is on the host
    one = [dict(p) for p in model(host=set())]
    one[2] = param("model.layers.0.mlp.experts.w13_weight", W13, memory="host", marked=True)
    assert judge(observation(one), budget, CALIBRATION).passed


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 1 << 20), min_size=1, max_size=12),
    chosen=st.lists(st.booleans(), min_size=12, max_size=12),
    budget=st.integers(0, 1 << 23),
)
def test_the_budget_replay_offloads_a_prefix_and_stops_once_the_bytes_reach_the_budget(sizes, chosen, budget):
    params = [{"name": f"p{i}", "nbytes": n, "selected": chosen[i]} for i, n in enumerate(sizes)]
    want = expected_host(params, Budget(budget, ("experts",)))
    sel = [p for p in params if p["selected"]]
    k = len(want)
    assert want == {p["name"] for p in sel[:k]}  # a prefix of the selected parameters, in order
    done = sum(p["nbytes"] for p in sel[:k])
    assert all(sum(p["nbytes"] for p in sel[:j]) < budget for j in range(k))  # each was below the budget when taken
    assert k == len(sel) or done >= budget  # stopped only at the end or at the budget


def test_an_offloader_that_counts_bytes_no_weight_holds_fails_the_accounting():
    v = judge(observation(model(), accounted=2 * (W13 + W2) + 4096), AMPLE, CALIBRATION)
    assert rules(v) == ["accounting"]
    assert v.findings[0].message == (
        f"vLLM's UVAOffloader accounted {2 * (W13 + W2) + 4096:,} B to the host; "
        f"{2 * (W13 + W2):,} B of the selected weights live in host memory"
    )


def test_pinned_allocations_may_round_up_to_a_power_of_two_and_the_drivers_minimum_but_no_further():
    assert [pow2ceil(n) for n in (1, 2, 3, 4096, 4097)] == [1, 2, 4, 4096, 8192]
    assert min_block(CALIBRATION) == 4096 and min_block(None) == 4096
    assert pinned_allowance(1024, 4096) == 4096 and pinned_allowance(3 << 20, 4096) == 4 << 20
    scale = param("model.layers.0.mlp.experts.w13_weight_scale_inv", 2048, memory="host", marked=True)
    odd = param("model.layers.0.mlp.experts.w2_weight", (3 << 20) + 8, memory="host", marked=True)
    params = [scale, dict(odd, range_size=4 << 20)]
    assert judge(observation(params), AMPLE, CALIBRATION).passed
    v = judge(observation([scale, dict(odd, range_size=8 << 20)]), AMPLE, CALIBRATION)
    assert rules(v) == ["pinned"]
    assert (
        "its pinned allocation is 8,388,608 B for 3,145,736 B of weights, above the 4,194,304 B"
        in v.findings[0].message
    )


def test_memory_cuda_does_not_know_is_a_failure_of_its_own():
    params = model()
    params[2] = dict(params[2], memory="unregistered", range_size=0)
    assert "not-cuda-memory" in rules(judge(observation(params), AMPLE, CALIBRATION))


@pytest.mark.parametrize(
    "name, segments, want",
    [
        ("model.layers.3.mlp.experts.w13_weight", ["experts"], True),
        ("model.layers.3.mlp.experts.routed_experts.w2_weight", ["experts.w2_weight"], False),
        ("model.layers.3.mlp.experts.routed_experts.w2_weight", ["routed_experts.w2_weight"], True),
        ("model.layers.3.mlp.experts.w13_weight_scale_inv", ["experts"], True),
        ("model.layers.3.mlp.gate.weight", ["experts"], False),
        ("model.embed_tokens.weight", [], False),  # outside the decoder layers the offloader never looks
        ("model.layers.0.self_attn.o_proj.weight", [], True),  # no selection: everything in a layer
        ("model.layers.0.mlp.experts.w13_weight", ["layers"], False),  # matched inside the layer, not the path to it
    ],
)
def test_selection_follows_vllms_whole_segment_rule_inside_a_decoder_layer(name, segments, want):
    assert selected(name, segments) is want


def test_a_verdict_is_plain_data():
    from moegate.offload.verdict import to_json

    d = to_json(judge(observation(model(host=set()), accounted=0), AMPLE, CALIBRATION))
    assert d["verdict"] == "FAIL" and d["findings"][0]["rule"] == "budget" and d["layers"]["0"][0]["expected"] == "host"
    assert dataclasses.is_dataclass(Budget) and Budget.from_gb(1, ["b", "a"]).segments == ("a", "b")
