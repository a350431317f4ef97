"""Every sha256 the project takes, in one place: of a file, of a text, and the short hash that keys a model folder.

Goldens, result files and run records keep these instead of the data (``golden/e2e/``, an A/B's
``run.json``, a tiny model's build record), so they are part of those formats: a change here changes
every key already written. Standard library only.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

BUILD_INFO = "moegate_tiny_model.json"
"""The build record a tiny model's folder carries (``moegate.model.tiny_spec``): its spec and every file's sha256."""

CHUNK = 1 << 20
"""A file is hashed this many bytes at a time, so a checkpoint of gigabytes is never read into memory whole."""


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The file's sha256, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def text_sha256(text: str) -> str:
    """The hash goldens and result files keep instead of a data set's text (its UTF-8 bytes' sha256, hex)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def bytes_sha256(chunks: Iterable[bytes]) -> str:
    """The sha256 of byte strings taken in order, hex: the differential kernel tier's input and output digests."""
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def record_line(name: str, data: bytes) -> str:
    """A wheel RECORD's line for the file ``name`` holding ``data``: urlsafe-base64 sha256 without padding, size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def model_hash(model_dir: str | os.PathLike[str]) -> str:
    """One short hash of a built model's files (weights, config, tokenizer), from its build record.

    For a directory without a record (a real checkpoint), the hash of its config and
    tokenizer files: enough to key goldens by, without reading gigabytes.
    """
    root = Path(model_dir)
    info = root / BUILD_INFO
    if info.is_file():
        record = json.loads(info.read_text())
        files = record.get("files")
        if files:
            # the spec and the tensors and tokenizer, not config.json: it names the transformers release
            numeric = {k: v for k, v in files.items() if k not in ("config.json", "generation_config.json")}
            key = json.dumps({"spec": record.get("spec"), "files": numeric}, sort_keys=True)
            return hashlib.sha256(key.encode()).hexdigest()[:16]
    h = hashlib.sha256()
    for f in sorted(root.glob("*.json")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
