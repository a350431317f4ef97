"""What the recorder changed: a finished pair's GSM8K responses, decoded ids against their re-tokenized text.

    python -m lab.gpu.gsm8k_decoded_check MODEL_DIR RUN_DIR...     # an env with the tokenizers package

Per run and build: how many of the questions have the ids the server decoded (``decoded.jsonl``, kept by
``moegate/serve/recorder.py``), and how many responses do not re-tokenize to those ids (the response text
encoded alone, as ``lab/gpu/gsm8k_retokenize.py`` does). Per run, of the gate's divergences
(``gate-gsm8k.json``): on which context each was re-scored, and at how many the re-tokenized response of
either build already differs from its decoded ids before the divergence (the re-tokenizing fallback would
have re-scored those on a context the server never decoded). Needs lm-eval's samples (on the unpacked
device output, not the committed files).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from moegate.e2e.run_data import read_raw


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not (Path(argv[0]) / "tokenizer.json").is_file():
        print("usage: python -m lab.gpu.gsm8k_decoded_check MODEL_DIR RUN_DIR...", file=sys.stderr)
        return 2
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(argv[0]) / "tokenizer.json"))
    for arg in argv[1:]:
        run = Path(arg)
        gate = json.loads((run / "gate-gsm8k.json").read_text())
        divs = gate["differences"][0]["divergences"]
        retok: dict[str, dict[int, list[int]]] = {}
        decoded: dict[str, dict[int, list[int]]] = {}
        for label in ("base", "pr"):
            g = read_raw(run, label).gsm8k
            assert g is not None, f"{run}: no GSM8K records for {label}"
            decoded[label] = {d: v["ids"] for d, v in g.decoded.items()}
            retok[label] = {
                int(r["doc_id"]): tok.encode(r["response"], add_special_tokens=False).ids for r in g.records
            }
            differ = sum(1 for d, ids in decoded[label].items() if retok[label][d] != ids)
            print(
                f"{run.parent.name} {label}: {len(decoded[label])}/{len(g.records)} with decoded ids; "
                f"{differ} re-tokenize to other ids"
            )
        contexts = Counter(d["context"] for d in divs)
        before = [
            d["doc_id"]
            for d in divs
            if any(retok[s][d["doc_id"]][: d["position"]] != decoded[s][d["doc_id"]][: d["position"]] for s in decoded)
        ]
        print(
            f"{run.parent.name}: {len(divs)} divergences, contexts {dict(contexts)}; explained "
            f"{sum(d['explained'] for d in divs)}; re-tokenized context differs before the divergence at "
            f"{len(before)}: {before}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
