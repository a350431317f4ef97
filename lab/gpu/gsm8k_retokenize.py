"""Is a GSM8K divergence re-scored on the context the server decoded? A CPU check of a pair's raw folder.

    python -m lab.gpu.gsm8k_retokenize PAIR_RUN_DIR MODEL_DIR [DOC,DOC...]    # an env with torch + transformers

The GSM8K gate re-scores each differing response's first divergence on the *re-tokenized* response text
(lm-eval records text, not token ids). Where the model generated a token split its tokenizer would not
produce (digits one by one where the tokenizer merges them, say), the re-scored context is not the one
decoded. This re-generates each divergent question greedily on the CPU (transformers, float32) from the
prompt in lm-eval's samples (``RUN/gsm8k-base/lm_eval/*/samples_*.jsonl``: GSM8K's questions, so this
runs where the samples are, never on committed files) and, per divergence, says one of:

- ``context = generation``: the CPU's greedy ids equal the re-tokenized base response up to the divergence;
- ``re-tokenized context differs at K``: at position K, before the divergence, the CPU's greedy ids split the
  same text differently from the re-tokenized base response;
- ``not informative``: the CPU's own greedy text leaves the base response before the divergence (its
  numerics are not the GPU's).

It prints the CPU's top 6 at the divergence (re-tokenized context) beside the GPU's re-scored top 5.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from moegate.e2e.lmeval.output import parse_samples


def _samples(run: Path, side: str) -> dict[int, dict[str, Any]]:
    """One build's lm-eval samples as moegate reads them: per doc id its prompt, response and extractions."""
    (path,) = (run / f"gsm8k-{side}" / "lm_eval").glob("*/samples_*.jsonl")
    with open(path, encoding="utf-8") as fh:
        return parse_samples(fh, source=str(path))


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: python -m lab.gpu.gsm8k_retokenize PAIR_RUN_DIR MODEL_DIR [DOC,DOC...]", file=sys.stderr)
        return 2
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    run, model_dir = Path(argv[0]), argv[1]
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gate = json.loads((run / "gate-gsm8k.json").read_text())
    divs = {int(d["doc_id"]): d for d in gate["differences"][0]["divergences"] if d.get("position") is not None}
    docs = [int(x) for x in argv[2].split(",")] if len(argv) == 3 else sorted(divs)
    base, pr = _samples(run, "base"), _samples(run, "pr")
    for doc in docs:
        d, pos = divs[doc], int(divs[doc]["position"])
        ctx = tok.encode(base[doc]["prompt"], add_special_tokens=True).ids
        responses = (base[doc]["response"], pr[doc]["response"])
        canon = tok.encode(responses[0], add_special_tokens=False).ids
        with torch.no_grad():
            gen = []
            if pos:
                out = model.generate(torch.tensor([ctx]), max_new_tokens=pos, do_sample=False, pad_token_id=0)
                gen = [int(t) for t in out[0, len(ctx) :]]
            lp = torch.log_softmax(model(torch.tensor([ctx + canon[:pos]])).logits[0, -1].float(), -1)
            top = torch.topk(lp, 6)
        k = next((i for i, (a, b) in enumerate(zip(gen, canon, strict=False)) if a != b), None)
        if k is None:
            verdict = "context = generation"
        else:
            # the same text split otherwise: the CPU's text, a few ids past k (whole characters), still the response's
            agree = [tok.decode(gen[:m]) for m in range(k + 2, min(len(gen), k + 4) + 1)]
            if any("\ufffd" not in t and responses[0].startswith(t) for t in agree):
                split = [tok.decode([t]) for t in gen[k : k + 2]], [tok.decode([t]) for t in canon[k : k + 1]]
                verdict = f"re-tokenized context differs at {k}: {split[0]} generated, {split[1]} re-tokenized"
            else:
                verdict = f"not informative (the CPU's greedy text leaves the base response at {k})"
        print(f"doc {doc} position {pos} ({'explained' if d.get('explained') else 'UNEXPLAINED'}): {verdict}")
        cpu = ", ".join(f"{int(i)} {float(v):.3f}" for v, i in zip(top.values, top.indices, strict=True))
        gpu = ", ".join(f"{t} {lp_:.3f}" for t, lp_ in d["top"][next(iter(d["top"]))])
        print(f"    CPU top at the divergence: {cpu}; GPU re-scored: {gpu}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
