"""The build under test fits moegate (``moegate.census.fit``): every module and name moegate drives is there and the
census reads it. The nightly run against vLLM's main branch asks the same before any case, and reports a build
where this fails as "moegate no longer fits this vLLM", not as a FAIL (``.github/workflows/vllm-main.yml``)."""

from __future__ import annotations

from moegate.census.fit import probe


def test_the_build_under_test_fits_moegate(installed):
    fit = probe(take=lambda: installed[1])  # the session's census of this vLLM, not a second one
    assert fit.moved == [] and fit.fits, fit.moved
    assert fit.checked[0] == "6 of 6 modules import"
