"""Helpers the tests share, kept out of the conftests (which hold only fixtures and hooks).

One module per tier that needs one (``tests.support.kernels``, ``tests.support.e2e``),
imported like any module: ``from tests.support.kernels import FP8``. This package
holds what every tier may use.
"""

from __future__ import annotations

from moegate import paths

ROOT = paths.ROOT
"""The repository root: the tests read the project's own files (goldens, workflows, noxfile) from here."""

TIERS = ("unit", "dispatch", "kernels", "meta", "e2e")
"""One directory per tier under ``tests/``, each a marker of the same name (``pytest -m "not kernels"``)."""
