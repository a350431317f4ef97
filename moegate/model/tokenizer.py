"""A byte-level BPE tokenizer for the tiny model, trained on GSM8K's train split.

Byte-level, so any text (ShareGPT prompts in any script, code) encodes without an
unknown token and never into more tokens than it has UTF-8 bytes. Trained in the
file's order from one thread's view of the data, so the same data and the same
``tokenizers`` release give a byte-identical ``tokenizer.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL = (BOS, EOS, PAD)  # ids 0, 1, 2: the model config's bos/eos ids


def _texts(data: Path) -> Iterator[str]:
    with open(data, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rec = json.loads(line)
                yield f"Question: {rec['question']}\nAnswer: {rec['answer']}\n\n"


def train_tokenizer(data: Path, out: Path, *, vocab: int, max_length: int) -> dict[str, Any]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out``; return what was built."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import tokenizers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_texts(data), trainer=trainer)
    if tok.get_vocab_size() > vocab:
        raise ValueError(f"tokenizer has {tok.get_vocab_size()} tokens, the model only {vocab}")
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return {"tokenizers": tokenizers.__version__, "vocab": tok.get_vocab_size(), "trained_on": data.name}
