"""A dev-versioned copy of an installed vLLM: the same code, a version no golden has.

    python -m moegate.builds.devsite SITE DEST --version 0.33.1.dev1+g1111111

``SITE`` is a folder that holds ``vllm/`` and its ``vllm-X.dist-info`` (a site-packages, or the GPU machine's
offline bundle ``$HOME/vllm-site``). ``DEST`` becomes a site that holds only vLLM, at the new version: ``vllm/`` with
its files hard-linked to the originals (seconds, no space; copied where the two folders are on different file
systems) except ``vllm/_version.py``, written anew, and ``vllm-VERSION.dist-info`` whose ``METADATA`` names the new
version and whose ``RECORD`` names the new files. Put ``DEST`` before ``SITE`` on a build's path
(``python -m moegate.builds.planted B --python PY --site DEST --site SITE``): ``vllm.__version__`` and
``importlib.metadata.version("vllm")`` both say the dev version, and every other package comes from ``SITE``.

That is a pull request's build as the caller workflow makes it (a wheel whose version is the next release's dev
one), for the rehearsal of issue 28: two such copies of one release are the same code under two labels no golden
has. Hard links are safe: a build never writes into vLLM's files (Python writes new ``.pyc`` files and renames them
over the old names, leaving the shared originals alone).

Made in a temporary folder beside ``DEST`` and renamed into place, so a failure leaves nothing half-written; a
``DEST`` that exists is replaced only when it is such a copy (``moegate-devsite.json``). Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from moegate.core.hashing import record_line

RECORD = "moegate-devsite.json"
VERSION_RE = re.compile(r"^\d+(\.\d+)*(\.dev\d+)?(\+[0-9A-Za-z.]+)?$")


class DevSiteError(ValueError):
    """One line: why the copy cannot be made."""


def version_tuple(version: str) -> tuple[int | str, ...]:
    """``0.33.1.dev1+g1111111`` -> ``(0, 33, 1, 'dev1', 'g1111111')``, as vLLM's generated ``_version.py`` spells it."""
    public, _, local = version.partition("+")
    parts: list[int | str] = [int(p) if p.isdigit() else p for p in public.split(".")]
    if local:
        parts.append(local)
    return tuple(parts)


def version_module(version: str) -> str:
    """The text of ``vllm/_version.py`` for ``version`` (its commit id: the local part, e.g. ``g1111111``)."""
    local = version.partition("+")[2] or None
    return (
        "# written by moegate.builds.devsite: a dev-versioned copy of an installed vLLM\n"
        f"__version__ = version = {version!r}\n"
        f"__version_tuple__ = version_tuple = {version_tuple(version)!r}\n"
        f"__commit_id__ = commit_id = {local!r}\n"
    )


def _dist_info(site: Path) -> Path:
    found = sorted(p for p in site.glob("vllm-*.dist-info") if (p / "METADATA").is_file())
    if len(found) != 1:
        raise DevSiteError(f"{site}: {len(found)} vllm-*.dist-info folders with a METADATA, want exactly 1")
    return found[0]


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed: a copy
        shutil.copy2(src, dst)


def make_devsite(site: str | Path, dest: str | Path, version: str) -> Path:
    """Make ``dest`` (see the module docstring) and return it."""
    site, dest = Path(site).expanduser().absolute(), Path(dest).expanduser().absolute()
    if not VERSION_RE.match(version):
        raise DevSiteError(f"--version {version!r}: not a version (e.g. 0.33.1.dev1+g1111111)")
    if not (site / "vllm" / "__init__.py").is_file():
        raise DevSiteError(f"{site}: no vllm/ package here (give the folder that holds vllm/ and its dist-info)")
    old_info = _dist_info(site)
    if dest.exists() and not (dest / RECORD).is_file():
        raise DevSiteError(f"{dest}: exists and is not a copy made here (no {RECORD}); choose another DEST")
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        shutil.copytree(
            site / "vllm", work / "vllm", copy_function=_link_or_copy, ignore=shutil.ignore_patterns("__pycache__")
        )
        text = version_module(version).encode()
        (work / "vllm" / "_version.py").unlink(missing_ok=True)  # a link to the original: replaced, not written through
        (work / "vllm" / "_version.py").write_bytes(text)
        new_info = work / f"vllm-{version}.dist-info"
        new_info.mkdir()
        old_name = old_info.name
        for item in old_info.iterdir():
            if item.is_dir():
                shutil.copytree(item, new_info / item.name)
            elif item.name == "METADATA":
                meta = item.read_text(encoding="utf-8")
                meta, n = re.subn(r"(?m)^Version: .*$", f"Version: {version}", meta, count=1)
                if n != 1:
                    raise DevSiteError(f"{item}: no 'Version:' line")
                (new_info / "METADATA").write_text(meta, encoding="utf-8")
            elif item.name != "RECORD":
                shutil.copy2(item, new_info / item.name)
        old_record = old_info / "RECORD"
        record = []
        for line in old_record.read_text(encoding="utf-8").splitlines() if old_record.is_file() else []:
            rel = line.split(",", 1)[0]
            if rel == "vllm/_version.py":
                record.append(record_line(rel, text))
            elif rel.startswith("vllm/"):
                record.append(line)
            elif rel.startswith(f"{old_name}/") and rel not in (f"{old_name}/METADATA", f"{old_name}/RECORD"):
                record.append(new_info.name + line[len(old_name) :])
        record.append(record_line(f"{new_info.name}/METADATA", (new_info / "METADATA").read_bytes()))
        record.append(f"{new_info.name}/RECORD,,")
        (new_info / "RECORD").write_text("\n".join(record) + "\n", encoding="utf-8")
        (work / RECORD).write_text(json.dumps({"from": str(site), "version": version}, indent=1) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        work.rename(dest)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)  # nothing half-written
        raise
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moegate.builds.devsite", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("site", help="the folder that holds vllm/ and its vllm-X.dist-info")
    ap.add_argument("dest", help="the new site (made, or remade if it is such a copy)")
    ap.add_argument("--version", required=True, help="the copy's version, e.g. 0.33.1.dev1+g1111111")
    args = ap.parse_args(argv)
    try:
        dest = make_devsite(args.site, args.dest, args.version)
    except (DevSiteError, OSError) as exc:
        print(f"moegate.builds.devsite: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    print(dest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
