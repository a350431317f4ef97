"""A folder written whole or not at all: what the checkpoint writers (``moegate.model``) put in place."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def replacing(out: Path) -> Iterator[Path]:
    """``with replacing(out) as tmp:`` write the new folder into ``tmp`` (beside ``out``, on its file system);
    at the end of the block it takes ``out``'s place by a rename. An error inside the block, or while moving,
    leaves ``out`` as it was (its old contents put back) and removes ``tmp``: nothing is half-written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    old = None
    try:
        yield tmp
        os.chmod(tmp, 0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            old.rename(out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
