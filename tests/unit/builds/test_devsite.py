"""``moegate.builds.devsite``: a dev-versioned copy of an installed vLLM, on a site laid out as vLLM's wheel lays it out
(``vllm/_version.py``, ``vllm-X.dist-info`` with METADATA and RECORD). A build that puts the copy first reports the dev
version through ``vllm.__version__`` and ``importlib.metadata`` alike; the original is untouched. (Checked on the CPU
0.33.0 environment's real site-packages too: 0.86 s for its 877 MB ``vllm/``, hard links: results/gate-front-door.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from moegate.builds import devsite
from moegate.builds.planted import make_build

INIT = "from vllm._version import __version__, __version_tuple__\n"


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text(INIT)
    (site / "vllm" / "_version.py").write_text("__version__ = version = '0.33.0'\n__version_tuple__ = (0, 33, 0)\n")
    (site / "vllm" / "ops.py").write_text("X = 1\n")
    info = site / "vllm-0.33.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.4\nName: vllm\nVersion: 0.33.0\nSummary: x\n")
    (info / "RECORD").write_text(
        "vllm/__init__.py,sha256=a,1\nvllm/_version.py,sha256=b,2\nvllm/ops.py,sha256=c,3\n"
        "vllm-0.33.0.dist-info/METADATA,sha256=d,4\nvllm-0.33.0.dist-info/RECORD,,\n../../bin/vllm,sha256=e,5\n"
    )
    (info / "entry_points.txt").write_text("[console_scripts]\nvllm = vllm.cli:main\n")
    return site


def test_a_build_with_the_copy_first_reports_the_dev_version_everywhere_and_the_original_is_untouched(tmp_path):
    site = _site(tmp_path)
    dest = devsite.make_devsite(site, tmp_path / "dev1", "0.33.1.dev1+g1111111")
    py = make_build(tmp_path / "b1", sys.executable, sites=[str(dest), str(site)])
    probe = "import json, vllm, importlib.metadata as m; print(json.dumps([vllm.__version__, m.version('vllm'), vllm.__file__]))"
    got = json.loads(subprocess.run([str(py), "-c", probe], capture_output=True, text=True, check=True).stdout)
    assert got == ["0.33.1.dev1+g1111111", "0.33.1.dev1+g1111111", str(dest / "vllm" / "__init__.py")]
    assert "0.33.0" in (site / "vllm" / "_version.py").read_text()  # the link was replaced, not written through
    assert (dest / "vllm" / "ops.py").stat().st_ino == (site / "vllm" / "ops.py").stat().st_ino  # linked, no copy
    record = (dest / "vllm-0.33.1.dev1+g1111111.dist-info" / "RECORD").read_text().splitlines()
    assert [r.split(",")[0] for r in record] == [
        "vllm/__init__.py", "vllm/_version.py", "vllm/ops.py",
        "vllm-0.33.1.dev1+g1111111.dist-info/METADATA", "vllm-0.33.1.dev1+g1111111.dist-info/RECORD",
    ]  # fmt: skip
    assert not list(tmp_path.glob(".dev1-*"))  # the temporary folder was renamed into place


def test_the_version_module_spells_the_tuple_as_vllms_own():
    assert devsite.version_tuple("0.33.1.dev2+g2222222") == (0, 33, 1, "dev2", "g2222222")
    assert devsite.version_tuple("0.34.0") == (0, 34, 0)
    namespace: dict = {}
    exec(devsite.version_module("0.33.1.dev2+g2222222"), namespace)  # noqa: S102 - the module's text, run as vLLM would
    assert namespace["__version__"] == "0.33.1.dev2+g2222222" and namespace["commit_id"] == "g2222222"


@pytest.mark.parametrize(
    ("setup", "args", "says"),
    [
        (lambda t: _site(t), ["--version", "next"], "--version 'next': not a version"),
        (lambda t: t / "empty", ["--version", "0.33.1.dev1"], "no vllm/ package here"),
        (
            lambda t: (_site(t), (t / "dest").mkdir(), (t / "dest" / "x").write_text(""))[0],
            ["--version", "0.33.1"],
            "exists and is not a copy made here",
        ),
    ],
    ids=["bad version", "not a site", "a folder of something else"],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, setup, args, says):
    site = setup(tmp_path)
    (tmp_path / "empty").mkdir(exist_ok=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert devsite.main([str(site), str(tmp_path / "dest"), *args]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("moegate.builds.devsite: ") and says in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
