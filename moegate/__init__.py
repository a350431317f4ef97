"""moegate: a property-based and differential test suite and CI gate for vLLM's fused-MoE dispatch.

``moegate.strategies`` (the Hypothesis strategies every tier draws from) lives at the repository's top
level, ``strategies/``, as the design card lays it out. An install puts it inside the package
(pyproject.toml: ``[tool.setuptools] package-dir``); a checkout imported without one (``PYTHONPATH=.``,
the power run's frozen copy of the suite) finds it beside this package through ``_CheckoutStrategies``.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__version__ = "0.1.0"

_STRATEGIES = Path(__file__).resolve().parent.parent / "strategies"


class _CheckoutStrategies(importlib.abc.MetaPathFinder):
    """Finds ``moegate.strategies`` in the checkout's ``strategies/``; every other name is left to the others."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != f"{__name__}.strategies":
            return None
        init = _STRATEGIES / "__init__.py"
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(_STRATEGIES)])


if not (Path(__file__).parent / "strategies").is_dir() and (_STRATEGIES / "__init__.py").is_file():
    sys.meta_path.insert(0, _CheckoutStrategies())
