"""What the session's kernel cases show together: no relative error common to a group's outputs.

Runs after every other kernel test (``conftest.py`` orders it last) on every
``run_checked`` call they made, grouped per entrypoint, placement and dtype
family (``moegate.kernels.systematic``; rule and false-alarm rate in docs/design/kernels-systematic.md).
"""

from __future__ import annotations

import json

import pytest

from moegate.kernels.systematic import Collector


def test_no_systematic_error_is_common_to_the_sessions_kernel_outputs(
    systematic_collector: Collector, record_testsuite_property
):
    summary = systematic_collector.summary()
    record_testsuite_property("systematic", json.dumps(summary.to_json(), separators=(",", ":")))
    print("\n".join(summary.lines()))
    if not summary.groups:
        pytest.skip(
            f"no group to judge: {systematic_collector.calls} kernel calls ran in this session, "
            f"{len(systematic_collector.samples)} with a sample, too few distinct calls per family"
        )
    assert not summary.detected, summary.failure_message()
