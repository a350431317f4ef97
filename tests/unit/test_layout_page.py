"""The layout page (docs/layout.md, linked from the README's Layout) names every module and top-level folder that
exists, and nothing that doesn't.

The page is the map a new maintainer reads first; it drifted before (9 of 18 modules listed), so the tree checks it
rather than a reviewer.
"""

from __future__ import annotations

import re
import subprocess

from tests.support import ROOT

PACKAGES = tuple(
    sorted(
        str(p.parent.relative_to(ROOT)) for top in ("moegate", "strategies") for p in (ROOT / top).rglob("__init__.py")
    )
)
"""Every package of the tree, ``strategies/`` (installed as ``moegate.strategies``) too; a new one is checked without
editing this file."""


def _layout() -> dict[str, str]:
    """Bullet text of the Layout section keyed by the first path it names (e.g. ``moegate/e2e/``)."""
    text = (ROOT / "docs" / "layout.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    bullets = re.split(r"\n- ", "\n" + section.strip())
    out = {}
    for bullet in bullets:
        m = re.match(r"`([^`]+)`", bullet.strip())
        if m:
            out[m.group(1).rstrip("/")] = bullet
    return out


def test_every_module_is_named_under_its_package():
    layout = _layout()
    missing = []
    for pkg in PACKAGES:
        bullet = layout.get(pkg)
        assert bullet is not None, f"docs/layout.md has no bullet for {pkg}/"
        for path in sorted((ROOT / pkg).glob("*.py")):
            if path.name == "__init__.py":
                continue
            if f"`{path.name}`" not in bullet:  # named as code: `folders.py`, not a word of the prose ("model folders")
                missing.append(f"{pkg}/{path.name}")
    assert not missing, f"docs/layout.md does not name: {missing}"


def test_every_named_module_exists():
    layout = _layout()
    stale = []
    for pkg in PACKAGES:
        for name in re.findall(r"`([\w]+\.py)`", layout.get(pkg, "")):
            if not (ROOT / pkg / name).exists():
                stale.append(f"{pkg}/{name}")
    assert not stale, f"docs/layout.md names modules that do not exist: {stale}"


def test_every_tracked_top_level_folder_is_named():
    text = "\n".join(_layout().values())
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = sorted({line.split("/", 1)[0] for line in tracked.splitlines() if "/" in line})
    unnamed = [f for f in folders if not f.startswith(".") and f"`{f}/" not in text and f"`{f}`" not in text]
    assert not unnamed, f"docs/layout.md does not name top-level folders: {unnamed}"
