"""The tiny model's tokenizer: deterministic, lossless on any text, and a 5-shot GSM8K prompt fits."""

from __future__ import annotations

import hashlib
import json

import pytest

pytest.importorskip("tokenizers", reason="the tokenizer is trained with tokenizers")

from moegate.e2e.gsm8k_files import DataError, gsm8k_file
from moegate.model.tokenizer import SPECIAL, train_tokenizer


@pytest.fixture(scope="module")
def train_data():
    try:
        return gsm8k_file("train.jsonl")
    except DataError as exc:
        pytest.skip(f"GSM8K is not beside the checkout: {exc}")


@pytest.fixture(scope="module")
def trained(train_data, tmp_path_factory):
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    info = train_tokenizer(train_data, a, vocab=4096, max_length=4096)
    train_tokenizer(train_data, b, vocab=4096, max_length=4096)
    return a, b, info


def test_same_data_gives_byte_identical_files(trained):
    a, b, info = trained
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert hashlib.sha256((a / name).read_bytes()).digest() == hashlib.sha256((b / name).read_bytes()).digest()
    assert info["vocab"] == 4096


def test_special_tokens_have_the_ids_the_model_config_names(trained):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(trained[0] / "tokenizer.json"))
    assert [tok.token_to_id(t) for t in SPECIAL] == [0, 1, 2]


def test_any_text_round_trips_and_a_five_shot_prompt_fits(trained, train_data):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(trained[0] / "tokenizer.json"))
    for text in ("Natalia sold 48/2 = 24 clips.", "日本語のテキスト ünïcödé", "def f(x):\n\treturn x**2  # ok"):
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text and len(ids) <= len(text.encode())
    shots = [json.loads(line) for line in train_data.read_text().splitlines()[:6]]
    prompt = "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots[:5])
    prompt += f"Question: {shots[5]['question']}\nAnswer:"
    assert len(tok.encode(prompt).ids) + 256 < 4096
