"""``moegate fetch-gsm8k [--dir DIR] [--source URL]``: GSM8K from its authors' repository, each file's sha256 checked.

The e2e tier's GSM8K gate and the tiny models' tokenizer read GSM8K (``test.jsonl``, ``train.jsonl``) from the folder
``MOEGATE_GSM8K_DIR`` names (``moegate.e2e.gsm8k_files``); the data set is never part of the checkout. This puts it
there: both files downloaded from ``--source`` (default: ``openai/grade-school-math`` on GitHub, the authors' own
repository; a ``file://`` folder works too), each checked against the sha256 the project records
(``GSM8K_SHA256``), and only then moved into ``--dir`` together, so a failed or corrupt download leaves nothing
behind. Files already there with the right sha256 are kept. Prints the ``export`` line that points the tiers at it.

Run it from a checkout with any Python 3.11 or later, nothing installed: ``python3 -m moegate fetch-gsm8k``.
Exit status: 0 fetched (or already there), 1 a download failed or a file is not the published one (one line).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from moegate.core.hashing import sha256_file
from moegate.e2e.gsm8k_files import GSM8K_SHA256, gsm8k_dir
from moegate.paths import GSM8K_CACHE_DIR

SOURCE = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data"
DEFAULT_DIR = GSM8K_CACHE_DIR


class FetchError(RuntimeError):
    """One line: which file, from where, what went wrong."""


def default_dir() -> Path:
    """Where the gate looks for GSM8K (``moegate.e2e.gsm8k_files.gsm8k_dir``): ``MOEGATE_GSM8K_DIR``, else the cache."""
    return gsm8k_dir()


def _download(url: str, dest: Path, timeout: float) -> None:
    req = urllib.request.Request(url, headers={"User-Agent": "moegate-fetch-gsm8k"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp, open(dest, "wb") as fh:
            shutil.copyfileobj(resp, fh)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise FetchError(f"GSM8K: could not download {url}: {reason}") from None


def fetch(directory: Path, source: str = SOURCE, timeout: float = 60.0) -> list[str]:
    """Put both files in ``directory`` (see the module docstring); the lines that say what was done."""
    directory = directory.expanduser().absolute()
    todo = [
        n for n in GSM8K_SHA256 if not ((directory / n).is_file() and sha256_file(directory / n) == GSM8K_SHA256[n])
    ]
    said = [f"{directory / n}: already there, sha256 as published" for n in GSM8K_SHA256 if n not in todo]
    if not todo:
        return said
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gsm8k-", dir=directory) as tmp:
        for name in todo:
            url = f"{source.rstrip('/')}/{name}"
            part = Path(tmp) / name
            _download(url, part, timeout)
            got = sha256_file(part)
            if got != GSM8K_SHA256[name]:
                raise FetchError(
                    f"GSM8K: {url} has sha256 {got}, expected {GSM8K_SHA256[name]}: not the published file"
                )
        for name in todo:  # every file checked: now into place, each by a rename
            os.replace(Path(tmp) / name, directory / name)
            said.append(f"{directory / name}: fetched from {source.rstrip('/')}, sha256 as published")
    return said


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="moegate fetch-gsm8k", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help=f"where to (default: $MOEGATE_GSM8K_DIR or {DEFAULT_DIR})")
    ap.add_argument("--source", default=SOURCE, help="the folder URL holding test.jsonl and train.jsonl")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per download")
    args = ap.parse_args(argv)
    directory = args.dir or default_dir()
    try:
        for line in fetch(directory, args.source, args.timeout):
            print(line)
    except FetchError as exc:
        print(f"moegate fetch-gsm8k: {exc}", file=sys.stderr)
        return 1
    print(f"export MOEGATE_GSM8K_DIR={directory.expanduser().absolute()}")
    return 0
