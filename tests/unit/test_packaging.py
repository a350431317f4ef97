"""What the wheel installs: pyproject.toml lists every package of the tree, ``strategies/`` as ``moegate.strategies``.

A package mapped to another folder (``[tool.setuptools] package-dir``) cannot be found by setuptools, so the
packages are listed by hand; this keeps the list equal to the tree (``nox -s wheel-check`` then imports
``moegate.strategies`` from the installed wheel).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from tests.support import ROOT


def tree_packages(root: Path, setuptools: dict[str, Any]) -> set[str]:
    """Every package under ``moegate/`` and under each mapped folder, by the name it installs as."""
    folders = {"moegate": "moegate", **setuptools.get("package-dir", {})}
    return {
        ".".join((name, *init.parent.relative_to(root / folder).parts))
        for name, folder in folders.items()
        for init in (root / folder).rglob("__init__.py")
    }


def unlisted(root: Path) -> tuple[list[str], list[str]]:
    """(packages of the tree the list lacks, listed packages the tree lacks)."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree, listed = tree_packages(root, setuptools), set(setuptools["packages"])
    return sorted(tree - listed), sorted(listed - tree)


def test_the_package_list_is_the_tree():
    missing, stale = unlisted(ROOT)
    assert not missing, f"pyproject.toml [tool.setuptools] packages lacks {missing}: the wheel would leave them out"
    assert not stale, f"pyproject.toml [tool.setuptools] packages names {stale}, which the tree does not have"


def test_strategies_install_as_moegate_strategies():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"moegate.strategies": "strategies"}
    assert "moegate.strategies" in tree_packages(ROOT, setuptools)


def test_a_new_package_or_a_stale_entry_is_named(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "moegate.strategies" = "strategies" }\n'
        'packages = ["moegate", "moegate.strategies", "moegate.gone"]\n'
    )
    for folder in ("moegate", "moegate/e2e/lmeval", "strategies"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    assert unlisted(tmp_path) == (["moegate.e2e.lmeval"], ["moegate.gone"])
