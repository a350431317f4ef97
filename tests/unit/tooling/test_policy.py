"""The vLLM repository's policy file (tooling/ci/policy.py): the example reads, and every bad file is one line."""

from __future__ import annotations

import pytest

from tests.support import ROOT

pytest.importorskip("yaml", reason="PyYAML is not installed here (the unit env has it: nox -s unit)")

from tooling.ci.policy import Policy, PolicyError, parse

EXAMPLE = (ROOT / "examples" / "moegate-policy.yml").read_text()


def test_the_example_policy_reads_as_the_caller_and_verdict_examples_expect():
    policy = parse(EXAMPLE)
    assert policy.caller == ".github/workflows/moegate.yml"
    assert policy.caller_jobs == ("changes", "wheels", "moegate") and policy.moegate_job == "moegate"
    assert policy.tiers == ("dispatch", "kernels", "e2e", "ab") and policy.models == ("random", "trained")
    assert policy.ab_gate is True and policy.ab_gate_threshold == 0.03 and policy.min_kernel_tests == 40
    assert policy.equivalent == "label" and policy.equivalent_label == "moegate-equivalent"
    assert policy.reusable == "your-org/moegate/.github/workflows/moegate.yml"
    caller = (ROOT / "examples" / "vllm-caller.yml").read_text()
    assert all(f"@{ref}" in caller and f"moegate-ref: {ref}" in caller for ref in policy.moegate_refs)


def test_a_minimal_policy_takes_the_defaults():
    policy = parse(
        "caller: .github/workflows/moegate.yml\ncaller-jobs: [moegate]\nmoegate-repository: o/moegate\n"
        f"moegate-refs: [{'a' * 40}]\ntiers: dispatch,kernels\n"
    )
    assert policy == Policy(".github/workflows/moegate.yml", ("moegate",), "moegate", "o/moegate", ("a" * 40,),
                            ("dispatch", "kernels"))  # fmt: skip
    assert (
        policy.runner_labels == ("self-hosted", "linux", "x64", "gpu", "rtx4090") and policy.status_context == "moegate"
    )


def _without(key: str) -> str:
    return "\n".join(ln for ln in EXAMPLE.splitlines() if not ln.startswith(f"{key}:") and not ln.startswith("  - "))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("caller: [unclosed", "not YAML at line 1"),
        ("- a list\n- of things\n", "not a mapping of policy keys (got list)"),
        (EXAMPLE + "tier: [dispatch]\n", "unknown key 'tier'; known: caller, "),
        (_without("moegate-refs"), "moegate-refs is missing"),
        (EXAMPLE.replace("tiers: [dispatch, kernels, e2e, ab]", "tiers: [kernels]"), "tiers must include dispatch"),
        (EXAMPLE.replace("tiers: [dispatch, kernels, e2e, ab]", "tiers: [dispatch, bench]"), "unknown tier 'bench'"),
        (
            EXAMPLE.replace("0123456789abcdef0123456789abcdef01234567", "v1.2"),
            "must be full commit SHAs (40 hex), not 'v1.2'",
        ),
        (EXAMPLE.replace("ab-gate: true", "ab-gate: yes please"), "ab-gate must be true or false"),
        (EXAMPLE.replace("ab-gate-threshold: 0.03", "ab-gate-threshold: 3"), "ab-gate-threshold must be a fraction"),
        (EXAMPLE.replace("min-kernel-tests: 40", "min-kernel-tests: 0"), "min-kernel-tests must be a whole number"),
        (EXAMPLE.replace("equivalent: label", "equivalent: sometimes"), "equivalent must be label or never"),
        (EXAMPLE.replace("moegate-job: moegate", "moegate-job: gate"), "moegate-job 'gate' is not one of caller-jobs"),
        (
            EXAMPLE.replace("caller-jobs: [changes, wheels, moegate]", "caller-jobs: []"),
            "caller-jobs must be a non-empty",
        ),
        (EXAMPLE.replace("moegate-repository: your-org/moegate", "moegate-repository: moegate"), "must be owner/name"),
    ],
)
def test_a_policy_that_cannot_be_read_is_one_line_naming_the_file(text, says):
    with pytest.raises(PolicyError) as err:
        parse(text, "POLICY")
    message = str(err.value)
    assert "\n" not in message and message.startswith("POLICY: ") and says in message, message
