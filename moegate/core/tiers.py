"""The tiers and models a gate run names, and the one line that refuses an unknown one.

One vocabulary for every door that takes them, so each refuses alike:

- ``moegate gate --tiers`` gates one build: ``GATE_TIERS``;
- the reusable workflow's ``plan`` job (``tooling/ci/gate_plan.py``, what a GitHub caller's inputs meet first):
  ``CI_TIERS``, and ``models`` for its e2e and A/B legs;
- the Buildkite steps (``moegate buildkite``): ``BUILDKITE_TIERS``, the tiers one build's image runs alone.

A model is one of ``MODELS`` (the random tiny model built on the runner, the committed trained one) or a folder's
path, which says so by a ``/`` (``./qwen3``, ``/data/qwen3``): a bare word that is neither is a typo, refused before
anything is built. Standard library only: the ``plan`` job imports it with the runner's own python3.
"""

from __future__ import annotations

from collections.abc import Sequence

GATE_TIERS = ("dispatch", "kernels", "sweep", "diff")
"""``moegate gate``: the path rule, the kernels' outputs (a CUDA GPU), the nightly sweep (a CUDA GPU)."""
CI_TIERS = ("dispatch", "meta", "kernels", "e2e", "ab")
"""The reusable workflow's ``tiers`` input."""
BUILDKITE_TIERS = ("dispatch", "kernels")
"""A Buildkite step runs in the image of one build, the PR's: the tiers that gate one build."""
MODELS = ("random", "trained")
"""The e2e and A/B legs' named models; anything else must be a folder's path."""


class UnknownInput(ValueError):
    """One line: which value is unknown, where it was given, what is known."""


def parse_tiers(text: str, known: Sequence[str], where: str = "tiers") -> list[str]:
    """The tiers of a comma list, in the order given, each once; ``UnknownInput`` for none or an unknown one."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise UnknownInput(f"{where}={text!r} names no tier; choose from {', '.join(known)}")
    for name in names:
        if name not in known:
            raise UnknownInput(f"unknown tier {name!r} in {where}={text!r}; known: {', '.join(known)}")
    return list(dict.fromkeys(names))


def parse_models(text: str, where: str = "models") -> list[str]:
    """The models of a comma list, each once; ``UnknownInput`` for none or a bare word that is no known model."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    if not names:
        raise UnknownInput(f"{where}={text!r} names no model; choose from {', '.join(MODELS)} or a folder's path")
    for name in names:
        if name not in MODELS and "/" not in name:
            raise UnknownInput(
                f"unknown model {name!r} in {where}={text!r}; known: {', '.join(MODELS)}, or a folder's path "
                f"(with a /: ./{name})"
            )
    return list(dict.fromkeys(names))
