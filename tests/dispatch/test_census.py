"""The census of the installed vLLM (``moegate.census``) against the reviewed goldens.

The first test holds the whole census of a release to that release's golden: a new
model class, a changed MoE layer or tuned config, a new or changed dispatch site
fails until someone reviews the diff and blesses it
(``python -m moegate.census --bless``, or this test with ``--bless``). A
build with no golden of its own (a pull request's) skips it; the second test still
holds its dispatch sites to the newest reviewed release's: a new caller of the
decision or of the alignment, or a caller whose call changed, fails there until
reviewed. The census reads vLLM's files and imports nothing from it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from moegate.census import census, sites
from moegate.core import golden_files


def test_census_matches_the_reviewed_golden_of_the_installed_release(installed, bless):
    """The whole census, held to its release's golden; beside another transformers, all but what it pins.

    The values config classes pin (the layers' ``values``, the ``shape`` lines) come partly
    from transformers: another release of it (a GPU machine's image, vLLM installed
    without it) changes them without vLLM changing. There every other line is still held
    to the golden, and the mismatch names the two transformers releases.
    """
    version, taken = installed
    path = census.golden_path(version)
    if not path.exists() and not bless:
        reviewed = ", ".join(census.committed()) or "none"
        pytest.skip(
            f"no census golden for vLLM {version} (reviewed releases: {reviewed}); its dispatch sites are held to "
            f"the newest reviewed release's by the next test; `{census.BLESS}` writes one to review"
        )
    _hold(version, taken, bless)


def _hold(version: str, taken: census.Census, bless: bool = False) -> None:
    path = census.golden_path(version)
    if path.exists() and not bless:
        text = path.read_text()
        want_tf, got_tf = census.stamp(text, "transformers"), taken.transformers or "absent"
        if want_tf != got_tf:
            want = census.without_transformers(census.parse_golden(text))
            got = census.without_transformers(taken.records)
            diff = sorted(set(want) ^ set(got))
            assert not diff, (
                f"vLLM {version}'s census differs from {path} beyond what transformers pins (golden taken beside "
                f"transformers {want_tf}, this vLLM sits beside {got_tf}):\n"
                + "\n".join(("- " if d in want else "+ ") + d for d in diff[:40])
            )
            return
    golden_files.check(census.golden_name(version), census.render(taken), bless=bless, hint=census.BLESS)


def test_beside_another_transformers_everything_but_its_values_is_still_held(installed):
    """The branch above, exercised: the same census as if beside another transformers passes, a changed site fails."""
    version, taken = installed
    if not census.golden_path(version).exists():
        pytest.skip(f"no census golden for vLLM {version}")
    elsewhere = dataclasses.replace(taken, transformers="another")
    _hold(version, elsewhere)
    changed = tuple(dict(r, reason="changed") if r["kind"] == "site" else r for r in taken.records)
    with pytest.raises(AssertionError, match="beyond what transformers pins"):
        _hold(version, dataclasses.replace(elsewhere, records=changed))


def test_dispatch_sites_are_the_reviewed_ones(installed):
    """Every caller of the decision and of the alignment, and each call's arguments, as reviewed."""
    version, taken = installed
    ref = census.reference_golden(version)
    if ref is None:
        pytest.fail(f"no census golden under {census.golden_path(version).parent}: nothing to hold the sites to")
    ref_version, path = ref
    want = {census.site_key(r): r for r in census.parse_golden(path.read_text()) if r["kind"] == "site"}
    got = {census.site_key(r): r for r in taken.of("site")}
    problems = [f"new, unreviewed: {json.dumps(got[k], sort_keys=True)}" for k in sorted(got.keys() - want.keys())]
    problems += [f"gone: {k}" for k in sorted(want.keys() - got.keys())]
    problems += [
        f"changed: {k}\n    reviewed: {json.dumps(want[k], sort_keys=True)}\n    now:      {json.dumps(got[k], sort_keys=True)}"
        for k in sorted(got.keys() & want.keys())
        if got[k] != want[k]
    ]
    assert not problems, (
        f"vLLM {version}'s dispatch sites differ from those reviewed for vLLM {ref_version} ({path}):\n"
        + "\n".join(problems)
        + f"\nreview each under docs/spec.md (moegate/census/reviewed.py for exceptions), then `{census.BLESS}`"
    )
    unsettled = [census.site_key(r) for r in taken.of("site") if r["rule"] not in sites.ACCEPTED]
    if version != ref_version:
        assert not unsettled, f"sites no rule settles and nobody reviewed: {unsettled}"
