"""Every dispatch site the census classified, checked where it can run (item 3 of issue 30).

The census (``golden/census/``) lists every caller of the assignment decision and of the
alignment in vLLM and classifies it under docs/spec.md. Here each is run, decision-only,
through the dispatch tier's recorders:

- the two entrypoints and the modular wNa16 experts by the dispatch properties
  (``test_dispatch_properties.py``), which is where the spec's rule is checked in full;
- the reviewed exceptions (K2-Horizon's MoVA experts, the dots3 vision MoE) here: each must
  still decide by the rule without the host clause, so a release that makes one honour
  host residency fails here, and in the census, until the review is updated;
- the sites that always align (Marlin, batched Marlin, the native mxfp8 experts, the nvfp4
  emulation) here: each must align in the naive region, on device weights, where the
  decision would go naive, and hand the alignment the count its code says;
- the sites no machine of this project can drive are listed with the reason.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moegate.census import census
from moegate.census.sites import RULE_ALIGNS, RULE_EXCEPTION
from moegate.census.source import locate
from moegate.core.case import MoECase, Placement
from moegate.core.spec import expected_path, experts_counted
from moegate.dispatch import site_probes
from moegate.strategies import moe_cases
from tests.support import ROOT

FM = "model_executor/layers/fused_moe"
ELSEWHERE = {
    f"{FM}/fused_moe.py::fused_experts_impl": "tests/dispatch/test_dispatch_properties.py",
    f"{FM}/fused_moe.py::_prepare_expert_assignment": "tests/dispatch/test_dispatch_properties.py",
    f"{FM}/experts/triton_moe.py::TritonExperts.apply": "tests/dispatch/test_dispatch_properties.py",
    f"{FM}/experts/triton_moe.py::TritonWNA16Experts.apply": "tests/dispatch/test_dispatch_properties.py",
}
"""Sites the dispatch properties drive (the legacy and modular entrypoints, the decision, modular wNa16)."""

NOT_RUN = {
    f"{FM}/experts/rdna3_moe.py::Rdna3WNA16Experts.apply": (
        "AMD RDNA3 only (ROCm's wNa16 experts): no such GPU among moegate's machines; its code aligns on every path"
    ),
    f"{FM}/experts/fused_humming_moe.py::HummingIndexedExperts.prepare_humming_moe_kwargs": (
        "Humming experts are built from a Humming checkpoint's tuned kernel table; both branches align "
        "(reviewed in moegate/census/reviewed.py)"
    ),
    f"{FM}/experts/fused_humming_moe.py::HummingIndexedExperts.prepare_humming_moe_kwargs#2": (
        "as above: the re-alignment for w2's block size"
    ),
}
"""Sites with no probe, and why; their classification rests on the census's reading of their code."""

ALIGN_COUNT = {
    # how many experts each always-aligning site hands the alignment (None: the batched format has no count)
    "fused_marlin_moe": lambda c: c.total_experts,  # global_num_experts as passed
    "batched_fused_marlin_moe": lambda c: None,
    "fused_moe_mxfp8_native": lambda c: experts_counted(c, "modular"),  # w13's rows, or the global count with a map
    "Nvfp4QuantizationEmulationTritonExperts.apply": lambda c: c.total_experts,
}


@pytest.fixture(scope="module")
def site_rules() -> dict[str, str]:
    """Each site of the installed vLLM (its census) and its classification."""
    return {census.site_key(r): r["rule"] for r in census.take_sites(locate())}


def test_every_site_of_the_installed_vllm_is_checked_somewhere_or_says_why(site_rules):
    unchecked = sorted(set(site_rules) - set(site_probes.PROBES) - set(ELSEWHERE) - set(NOT_RUN))
    assert not unchecked, f"dispatch sites with no check and no reason: {unchecked}"
    for where in set(ELSEWHERE.values()):
        assert (ROOT / where).is_file(), where
    probed = {k: site_rules.get(k) for k in site_probes.PROBES}
    assert all(rule in (RULE_EXCEPTION, RULE_ALIGNS) for rule in probed.values()), probed


EXCEPTIONS = [k for k in site_probes.PROBES if k.endswith(("fused_mova_impl", "note_vision_fused_moe_fp8"))]
ALIGNING = [k for k in site_probes.PROBES if k not in EXCEPTIONS]
W13_HOST_OR_NOT = st.sampled_from([Placement(False, False), Placement(True, False)])


@pytest.mark.parametrize("site", EXCEPTIONS, ids=lambda k: k.split("::")[1])
@settings(max_examples=25)
@given(case=moe_cases(placement=W13_HOST_OR_NOT, dtype="bfloat16", shared=None))
def test_a_reviewed_exception_still_decides_by_the_rule_without_the_host_clause(target, site, site_rules, case):
    """Naive for host-resident weights in the naive region, as before 0.33.0: what the review allows."""
    assert site_rules.get(site) == RULE_EXCEPTION, f"{site} is no longer a reviewed exception: {site_rules.get(site)}"
    obs = site_probes.PROBES[site](target, case)
    want = expected_path(case, "legacy", host_rule=False)
    assert obs.path == want.path.value, (
        f"{site} took {obs.path} for {case.short()}; reviewed as an exception it keeps the old rule: {want}\n"
        f"  reproduce: python -m moegate repro '{case.to_json()}'"
    )
    assert all(n == case.total_experts for n in obs.align_num_experts), obs.align_num_experts


@pytest.mark.parametrize("site", ALIGNING, ids=lambda k: k.split("::")[1])
@settings(max_examples=15)
@given(case=moe_cases(placement=Placement(False, False), region="naive", dtype="bfloat16", shared=None))
def test_a_site_that_always_aligns_aligns_where_the_decision_would_go_naive(target, site, site_rules, case):
    assert site_rules.get(site) == RULE_ALIGNS, f"{site}: {site_rules.get(site)}"
    obs = site_probes.PROBES[site](target, case)
    assert obs.align_calls >= 1 and not any(launch.naive for launch in obs.launches), (
        f"{site} did not align for {case.short()} (a naive-region case on device weights): {obs.path}"
    )
    want = ALIGN_COUNT[site.split("::")[1]](case)
    if want is not None:
        assert obs.align_num_experts == [want], (
            f"{site}: alignment got {obs.align_num_experts} experts, code says {want}"
        )


def test_the_exceptions_are_the_two_callers_the_change_description_names():
    """Checked on the probes' side too: the census and this file agree on which sites are exceptions."""
    assert {k.split("::")[0] for k in EXCEPTIONS} == {
        "model_executor/models/k2_horizon.py",
        "models/dots3_note/nvidia/vision_moe.py",
    }
    assert MoECase(1, 1, 8).total_experts == 8  # the probes' cases count as the entrypoints' do
