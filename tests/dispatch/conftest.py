"""The dispatch tier's order: the properties first, the census's static checks last.

The census tests (``test_census*.py``, ``test_dispatch_sites.py``, ``test_fit.py``) read vLLM's source and
take several seconds; under ``-x`` (the mutation run, ``moegate.power.run``) a mutant that
the properties kill should not pay for them first, and a dispatch bug should be the first
failure a developer sees.
"""

from __future__ import annotations

import pytest

from moegate.census import census
from moegate.census.source import locate

LAST = ("test_census.py", "test_census_bad_input.py", "test_dispatch_sites.py", "test_fit.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Reorder within this directory's items only (a session with the kernel tier keeps that tier's own order)."""
    here = [i for i, item in enumerate(items) if item.path.parent.name == "dispatch"]
    mine = [items[i] for i in here]
    ordered = [item for item in mine if item.path.name not in LAST] + [item for item in mine if item.path.name in LAST]
    for i, item in zip(here, ordered):
        items[i] = item


@pytest.fixture(scope="session")
def installed() -> tuple[str, census.Census]:
    """The installed vLLM's release and census, taken once a session (several seconds: every test that reads it)."""
    src = locate()
    return src.version, census.take(src)
