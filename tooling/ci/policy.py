"""The vLLM repository's moegate policy: what a pull request's run must do at least, read at the merge base.

The verdict workflow (``examples/vllm-verdict.yml``) reads the vLLM repository's policy file (``POLICY_PATH`` there) at the pull request's
merge base, where the pull request cannot have edited it, and judges the caller's run against it
(``tooling/ci/run_check.py``). ``examples/moegate-policy.yml`` is the file to start from; every key:

=====================  ==============================================================================================
``caller``             the caller workflow's path (``.github/workflows/moegate.yml``): a run of any other file is no
                       verdict
``caller-jobs``        the caller's job ids; a job beside them (an impostor ``moegate verdict``) fails the verdict
``moegate-job``        the caller job that calls moegate's reusable workflow (default ``moegate``)
``moegate-repository`` owner/name of moegate
``moegate-refs``       the moegate commits (40 hex) the caller may call; two while the pin moves to a new commit
``tiers``              what a pull request that reaches the fused MoE must run (``dispatch`` runs on every one)
``models``             the e2e legs' models, each a leg of its own (default ``random, trained``)
``min-kernel-tests``   the floor of executed kernel tests a kernels leg must have run with (default 40)
``ab-gate``            the A/B leg must gate (true, the default) or may be advisory (false)
``ab-gate-threshold``  the largest decode slow-down the gating A/B may be set to tolerate (default 0.03)
``equivalent``         ``label`` (default): the ``equivalent`` promise needs ``equivalent-label``, applied by someone
                       with write access at the run's head; ``never``: the e2e legs must promise ``identical``
``equivalent-label``   that label's name (default ``moegate-equivalent``)
``runner-labels``      the labels every GPU leg's runner must carry (default the pool's: ``self-hosted, linux, x64,
                       gpu, rtx4090``)
``status-context``     the commit status the verdict posts, the one merging waits on (default ``moegate``)
=====================  ==============================================================================================

A file that cannot be read, is not YAML, or has an unknown key or a value of the wrong kind is one line
(``PolicyError``) and the verdict exits non-zero, posting an ``error`` status: a policy nobody can read gates nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tooling.ci.gate_plan import TIERS

POLICY_PATH = ".github/moegate-policy.yml"
SHA = re.compile(r"^[0-9a-f]{40}$")
REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+$")
DEFAULT_RUNNER_LABELS = ("self-hosted", "linux", "x64", "gpu", "rtx4090")
EQUIVALENT_MODES = ("label", "never")


class PolicyError(ValueError):
    """The policy cannot be read: one line naming the file and what is wrong."""


@dataclass(frozen=True)
class Policy:
    caller: str
    caller_jobs: tuple[str, ...]
    moegate_job: str
    moegate_repository: str
    moegate_refs: tuple[str, ...]
    tiers: tuple[str, ...]
    models: tuple[str, ...] = ("random", "trained")
    min_kernel_tests: int = 40
    ab_gate: bool = True
    ab_gate_threshold: float = 0.03
    equivalent: str = "label"
    equivalent_label: str = "moegate-equivalent"
    runner_labels: tuple[str, ...] = DEFAULT_RUNNER_LABELS
    status_context: str = "moegate"

    @property
    def reusable(self) -> str:
        """The reusable workflow the caller must call, as GitHub names it in a run's ``referenced_workflows``."""
        return f"{self.moegate_repository}/.github/workflows/moegate.yml"


KEYS = {
    "caller": "caller",
    "caller-jobs": "caller_jobs",
    "moegate-job": "moegate_job",
    "moegate-repository": "moegate_repository",
    "moegate-refs": "moegate_refs",
    "tiers": "tiers",
    "models": "models",
    "min-kernel-tests": "min_kernel_tests",
    "ab-gate": "ab_gate",
    "ab-gate-threshold": "ab_gate_threshold",
    "equivalent": "equivalent",
    "equivalent-label": "equivalent_label",
    "runner-labels": "runner_labels",
    "status-context": "status_context",
}
REQUIRED = ("caller", "caller-jobs", "moegate-repository", "moegate-refs", "tiers")


def _names(where: str, key: str, value: Any) -> tuple[str, ...]:
    """A YAML list of non-empty strings (a comma string is accepted too: ``dispatch,kernels``)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(i, str) and i.strip() for i in items):
        raise PolicyError(f"{where}: {key} must be a non-empty list of names, not {value!r}")
    return tuple(dict.fromkeys(i.strip() for i in items))


def parse(text: str, where: str = POLICY_PATH) -> Policy:
    """The policy in ``text`` (YAML); ``where`` names it in the one-line error."""
    import yaml  # PyYAML: the verdict job installs it; gate_plan's stdlib-only callers never import this module

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise PolicyError(f"{where}: not YAML{at} ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise PolicyError(f"{where}: not a mapping of policy keys (got {type(data).__name__})")
    unknown = sorted(str(k) for k in data if k not in KEYS)
    if unknown:
        raise PolicyError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(KEYS)}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise PolicyError(f"{where}: {missing[0]} is missing (required: {', '.join(REQUIRED)})")
    fields: dict[str, Any] = {}
    for key in ("caller", "moegate-job", "moegate-repository", "equivalent", "equivalent-label", "status-context"):
        if key in data:
            if not isinstance(data[key], str) or not data[key].strip():
                raise PolicyError(f"{where}: {key} must be a non-empty string, not {data[key]!r}")
            fields[KEYS[key]] = data[key].strip()
    for key in ("caller-jobs", "moegate-refs", "tiers", "models", "runner-labels"):
        if key in data:
            fields[KEYS[key]] = _names(where, key, data[key])
    if "min-kernel-tests" in data:
        n = data["min-kernel-tests"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise PolicyError(f"{where}: min-kernel-tests must be a whole number of at least 1, not {n!r}")
        fields["min_kernel_tests"] = n
    if "ab-gate" in data:
        if not isinstance(data["ab-gate"], bool):
            raise PolicyError(f"{where}: ab-gate must be true or false, not {data['ab-gate']!r}")
        fields["ab_gate"] = data["ab-gate"]
    if "ab-gate-threshold" in data:
        t = data["ab-gate-threshold"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1:
            raise PolicyError(f"{where}: ab-gate-threshold must be a fraction between 0 and 1 (0.03: 3 %), not {t!r}")
        fields["ab_gate_threshold"] = float(t)
    policy = Policy(**{"moegate_job": "moegate", **fields})
    _check(policy, where)
    return policy


def _check(policy: Policy, where: str) -> None:
    if not REPO.match(policy.moegate_repository):
        raise PolicyError(f"{where}: moegate-repository must be owner/name, not {policy.moegate_repository!r}")
    bad = [r for r in policy.moegate_refs if not SHA.match(r)]
    if bad:
        raise PolicyError(f"{where}: moegate-refs must be full commit SHAs (40 hex), not {bad[0]!r}")
    unknown = [t for t in policy.tiers if t not in TIERS]
    if unknown:
        raise PolicyError(f"{where}: unknown tier {unknown[0]!r} in tiers; known: {', '.join(TIERS)}")
    if "dispatch" not in policy.tiers:
        raise PolicyError(f"{where}: tiers must include dispatch (it runs on every pull request)")
    if policy.moegate_job not in policy.caller_jobs:
        raise PolicyError(f"{where}: moegate-job {policy.moegate_job!r} is not one of caller-jobs")
    if policy.equivalent not in EQUIVALENT_MODES:
        raise PolicyError(f"{where}: equivalent must be {' or '.join(EQUIVALENT_MODES)}, not {policy.equivalent!r}")
