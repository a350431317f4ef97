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

Each profile also sets how many examples a kernel-tier property runs
(``KERNEL_EXAMPLES``, read through ``kernel_examples``): a kernel example runs
vLLM's kernels on a GPU and the torch reference, one to nine calls, where a
dispatch example stops at the path decision, so the two tiers need their own
counts, and ``nightly`` scales both.
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

KERNEL_EXAMPLES: dict[str, int] = {"ci": 25, "dev": 25, "nightly": 200, "power": 25, "shrink": 25}
"""Examples per kernel-tier property and entrypoint. ``ci``/``dev``: the tier's twelve Hypothesis properties
in minutes of a GPU runner; ``nightly``: 2,400 examples, some 5,000-6,000 kernel calls (a property makes one to
nine per example). The kernel tier does not run under ``power`` or ``shrink``; they keep ``ci``'s count."""


def selected() -> str:
    """The profile's name: $MOEGATE_PROFILE, else ``ci`` under CI, else ``dev``."""
    return os.environ.get(PROFILE_ENV) or ("ci" if os.environ.get("CI") else "dev")


def load(name: str | None = None) -> str:
    """Load the named profile (default: ``selected()``) and return its name."""
    name = name or selected()
    if name not in KNOWN:
        raise SystemExit(f"moegate: unknown Hypothesis profile {name!r} in ${PROFILE_ENV}; choose one of {KNOWN}")
    settings.load_profile(name)
    return name


def kernel_examples(name: str | None = None) -> int:
    """Examples per kernel-tier property under the named profile (default: ``selected()``)."""
    name = name or selected()
    if name not in KERNEL_EXAMPLES:
        raise SystemExit(f"moegate: unknown Hypothesis profile {name!r} in ${PROFILE_ENV}; choose one of {KNOWN}")
    return KERNEL_EXAMPLES[name]
