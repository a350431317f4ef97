"""The experts' plant (``moegate/builds/planted/plant_experts.py``) loaded from its file, as a build's interpreter
imports it: the plant is self-contained and is never imported from the checkout by the package."""

from __future__ import annotations

import importlib.util
from typing import Any

from moegate.builds.planted import PLANT_EXPERTS_SOURCE


def experts_plants() -> Any:
    """A fresh module object of the experts' plant."""
    spec = importlib.util.spec_from_file_location("moegate_planted_experts", PLANT_EXPERTS_SOURCE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
