"""Hypothesis profiles, selected by the MOEGATE_PROFILE environment variable.

- ``ci``: derandomized (the same examples on every run, so a red CI is reproducible
  and a green one is not luck), no deadline (CI machines stall), reproduction blobs
  printed, no example database (nothing to carry between clean clones).
- ``dev`` (default): random, with the local example database so a failure found
  once is replayed first next time.
- ``nightly``: many more examples, random (not derandomized, even under CI), with an
  example database in ``.hypothesis/examples`` (or ``$MOEGATE_HYPOTHESIS_DB``) that the
  scheduled job carries between runs as an artifact, so a failure found one night is
  replayed first the next.
- ``power``: what the mutation run uses: derandomized like ``ci``, fewer examples,
  since each mutant only needs to be killed once.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILE_ENV = "MOEGATE_PROFILE"
DB_ENV = "MOEGATE_HYPOTHESIS_DB"
NIGHTLY_DB = os.environ.get(DB_ENV) or os.path.join(".hypothesis", "examples")

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    database=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=100, print_blob=True)
settings.register_profile(
    "nightly",
    derandomize=False,  # explicit: under CI Hypothesis's own default profile derandomizes
    deadline=None,
    max_examples=5000,
    print_blob=True,
    database=DirectoryBasedExampleDatabase(NIGHTLY_DB),
)
settings.register_profile("power", derandomize=True, deadline=None, database=None, max_examples=100, print_blob=True)
# The meta-check's view of the base: no pinned @examples, so what it reports is a
# counterexample Hypothesis found and shrank, not one we wrote down.
settings.register_profile(
    "shrink",
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=200,
    print_blob=True,
    phases=[Phase.generate, Phase.target, Phase.shrink, Phase.explain],
)

KNOWN = ("ci", "dev", "nightly", "power", "shrink")


def load(name: str | None = None) -> str:
    """Load the named profile (default: $MOEGATE_PROFILE, else ``ci`` under CI, else ``dev``)."""
    name = name or os.environ.get(PROFILE_ENV) or ("ci" if os.environ.get("CI") else "dev")
    if name not in KNOWN:
        raise SystemExit(f"moegate: unknown Hypothesis profile {name!r} in ${PROFILE_ENV}; choose one of {KNOWN}")
    settings.load_profile(name)
    return name
