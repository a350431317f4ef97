"""What the kernel sweep's workers share on one machine: how many of them fit (GPU memory, pinned host memory, cores) and Triton's disk cache."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# --- how many workers fit ----------------------------------------------------------------

GPU_GIB_PER_WORKER = 8  # above each worker's peak on the H200 at 5,000 cases (results/kernels-0.33.0.md)


HOST_GIB_PER_WORKER = 10  # pinned weights (measured: results/kernels-0.33.0.md) plus the process and its compiler


CORES_PER_WORKER = 2  # compilation takes one; torch's CPU work and the loop the other


def auto_workers(gpu_bytes: int, host_bytes: int, cores: int) -> int:
    """Workers that fit one GPU and its host: 8 on an H200 machine (141 GB, 128 GiB, 16 cores), 2 on a 24 GB card."""
    gib = 2**30
    fit = min(
        gpu_bytes // (GPU_GIB_PER_WORKER * gib), host_bytes // (HOST_GIB_PER_WORKER * gib), cores // CORES_PER_WORKER
    )
    return max(1, int(fit))


# --- Triton's disk cache, shared by the workers -----------------------------------------


def triton_cache_dir(flag: str | None, environ: Mapping[str, str]) -> tuple[Path, str]:
    """Where Triton keeps compiled kernels for this run, and what said so.

    ``flag`` (``--triton-cache``) first, then Triton's own rule: ``TRITON_CACHE_DIR``,
    else ``$TRITON_HOME/.triton/cache``, else ``~/.triton/cache``. The caller puts the
    answer into ``TRITON_CACHE_DIR`` so every worker uses this one directory.
    """
    if flag:
        return Path(flag).expanduser().absolute(), "--triton-cache"
    if environ.get("TRITON_CACHE_DIR"):
        return Path(environ["TRITON_CACHE_DIR"]).expanduser().absolute(), "TRITON_CACHE_DIR"
    home = environ.get("TRITON_HOME") or os.path.expanduser("~")
    return Path(home).expanduser().absolute() / ".triton" / "cache", "Triton's default"


def cache_entries(path: Path) -> int:
    """Entries in a Triton cache directory: one directory per compiled kernel (or launcher) key."""
    try:
        with os.scandir(path) as it:
            return sum(1 for entry in it if entry.is_dir())
    except FileNotFoundError:
        return 0


def triton_cache_in_use() -> str | None:
    """The cache directory Triton itself reports in this process (None where it cannot say)."""
    try:
        import triton

        return str(triton.knobs.cache.dir)
    except Exception:  # noqa: BLE001 - an older Triton or none: the figure is then the parent's alone
        return None
