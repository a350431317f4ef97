"""Where the e2e tier's data comes from, checked before use; never copied into the project.

GSM8K is read from an explicit option, from ``MOEGATE_GSM8K_DIR``, or from the folder
``moegate fetch-gsm8k`` fills; each file's sha256 must be the one its authors published
(``GSM8K_SHA256``), so a truncated or edited
copy is one clear error instead of a silently different benchmark.
"""

from __future__ import annotations

import os
from pathlib import Path

from moegate.core.hashing import sha256_file
from moegate.paths import GSM8K_CACHE_DIR, GSM8K_ENV

GSM8K_SHA256 = {
    "test.jsonl": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    "train.jsonl": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
}


class DataError(RuntimeError):
    """A data file that is missing or not the published one."""


def gsm8k_dir(option: str | os.PathLike[str] | None = None) -> Path:
    """The GSM8K folder: the option, else ``MOEGATE_GSM8K_DIR``, else where ``moegate fetch-gsm8k`` puts it."""
    if option:
        return Path(option).expanduser()
    if os.environ.get(GSM8K_ENV, "").strip():
        return Path(os.environ[GSM8K_ENV].strip()).expanduser()
    return GSM8K_CACHE_DIR


def gsm8k_file(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """``test.jsonl`` or ``train.jsonl``, after checking its sha256."""
    if name not in GSM8K_SHA256:
        raise DataError(f"unknown GSM8K file {name!r}; known: {', '.join(GSM8K_SHA256)}")
    path = gsm8k_dir(directory) / name
    if not path.is_file():
        raise DataError(
            f"{path} is missing (point MOEGATE_GSM8K_DIR or --gsm8k-dir at the folder with test.jsonl and train.jsonl)"
        )
    got = sha256_file(path)
    if got != GSM8K_SHA256[name]:
        raise DataError(f"{path} has sha256 {got}, expected {GSM8K_SHA256[name]}: not the published file")
    return path
