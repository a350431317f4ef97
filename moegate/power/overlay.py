"""The throw-away overlay cosmic-ray mutates, and the frozen copy of the suite each mutant runs against.

The installed vLLM is never written. cosmic-ray mutates files in place, so it is
pointed at an *overlay*: a throw-away directory holding a ``vllm`` package tree
made of symlinks to the installed one, except along the paths to the mutated
files, which are real directories, and the mutated files themselves, which are
real copies (new inodes: writing them cannot reach the installed file). The
overlay goes first on the path of the build every test run uses (a venv made by
``moegate.power.run.make_test_build``). Each run's work directory
records its owner's pid, so whatever ends a run (interrupt, timeout, crash, even
SIGKILL) can only leave a stale directory in the temp dir, which the next run
removes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from moegate.serve.processes import pid_alive

WORKDIR_PREFIX = "moegate-power-"
CLAIM_PREFIX = "moegate-claim-power-"  # a work directory before it is marked: clean_stale_workdirs never sees it
SUITE_PATHS = ("moegate", "strategies", "tests", "golden", "pyproject.toml")


def make_workdir(tmp: Path | None = None) -> Path:
    """A fresh work directory in the temp dir, marked with this process's pid (see ``clean_stale_workdirs``).

    It is made under another name, marked, then renamed into ``WORKDIR_PREFIX``: a run starting beside this
    one (shards side by side) cleans stale directories, and would take an unmarked one for a dead run's.
    """
    claim = Path(tempfile.mkdtemp(prefix=CLAIM_PREFIX, dir=tmp))
    (claim / "owner.pid").write_text(str(os.getpid()))
    work = claim.with_name(WORKDIR_PREFIX + claim.name.removeprefix(CLAIM_PREFIX))
    claim.rename(work)
    return work


def build_overlay(package_dir: Path, overlay_root: Path, files: Sequence[str]) -> dict[str, Path]:
    """Mirror ``package_dir`` under ``overlay_root`` with real copies of ``files``; return their copies.

    Directories on the way to a copied file are real (so the copy can sit in
    them); every other entry is a symlink into the installed package; no
    ``__pycache__`` is mirrored into a real directory (a stale pyc of the
    unmutated file must never be loaded for a mutant).
    """
    dst_pkg = overlay_root / package_dir.name
    real_dirs = {Path(".")}
    for f in files:
        real_dirs.update(Path(f).parents)
    copies = {Path(f) for f in files}
    for rel in sorted(real_dirs, key=lambda p: len(p.parts)):
        (dst_pkg / rel).mkdir(parents=True, exist_ok=True)
        for entry in (package_dir / rel).iterdir():
            sub = rel / entry.name
            if entry.name == "__pycache__" or sub in real_dirs or sub in copies:
                continue
            os.symlink(entry, dst_pkg / sub)
    out: dict[str, Path] = {}
    for f in files:
        src, dst = package_dir / f, dst_pkg / f
        shutil.copyfile(src, dst)  # a new inode with a fresh mtime, never a link
        out[f] = dst
    return out


def snapshot_suite(root: Path, dest: Path) -> str:
    """Copy the suite (tests, strategies, spec, adapter, goldens) the mutants run against; return its git revision.

    A mutation run takes many minutes; edits landing in the working tree meanwhile
    must not change the suite half-way through (the baseline would no longer vouch
    for it), so every test run uses this frozen copy.
    """
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "*.obtained")
    for name in SUITE_PATHS:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        elif src.exists():
            shutil.copyfile(src, dest / name)
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", *SUITE_PATHS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return rev + (" + uncommitted changes" if dirty else "")


def clean_stale_workdirs(tmp: Path | None = None) -> list[Path]:
    """Remove overlays left by runs that were killed (their owner pid is gone)."""
    removed = []
    for d in Path(tmp or tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
        pid_file = d / "owner.pid"
        try:
            pid = int(pid_file.read_text())
        except (OSError, ValueError):
            pid = -1
        if pid > 0 and pid_alive(pid):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed
