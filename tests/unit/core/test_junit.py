"""moegate.core.junit.failed on a JUnit report pytest itself wrote: each failing or erroring test, by the id pytest
prints, with its report's text."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from moegate.core.junit import failed


def test_the_failing_tests_of_a_real_pytest_report_are_named_as_pytest_names_them(tmp_path):
    tests = tmp_path / "tests" / "kernels"
    tests.mkdir(parents=True)
    (tmp_path / "tests" / "__init__.py").write_text("")
    (tests / "__init__.py").write_text("")
    (tests / "test_x.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.fixture
            def broken():
                raise RuntimeError("CUDA error: out of memory")

            def test_passes():
                pass

            @pytest.mark.parametrize("ep", ["legacy"])
            def test_fails(ep):
                assert 1 == 2, "output outside the tolerance"

            def test_errors(broken):
                pass

            class TestGroup:
                def test_in_class(self):
                    raise ValueError("planted")
            """
        )
    )
    report = tmp_path / "r.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests", f"--junitxml={report}"],
        cwd=tmp_path, capture_output=True, check=False,
    )  # fmt: skip
    got = failed(report)
    assert [f.nodeid for f in got] == [
        "tests/kernels/test_x.py::test_fails[legacy]",
        "tests/kernels/test_x.py::test_errors",
        "tests/kernels/test_x.py::TestGroup::test_in_class",
    ]
    assert "output outside the tolerance" in got[0].message and "assert 1 == 2" in got[0].text
    assert "CUDA error: out of memory" in got[1].text
    assert "planted" in got[2].text
