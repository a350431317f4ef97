"""``moegate.builds.extensions``: every compiled extension of a build by sha256 (a wheel, a site, a Python), and
the rule two builds' records keep against what the pull request changed."""

from __future__ import annotations

import hashlib
import stat
import sys
import zipfile
from pathlib import Path

import pytest

from moegate.builds.changes import CompiledChanges, Counted
from moegate.builds.extensions import BuildError, compare, record

MOE, C = "_moe_C_stable_libtorch", "_C_stable_libtorch"
LIBS = {f"vllm/{MOE}.abi3.so": b"moe-base", f"vllm/{C}.abi3.so": b"c-base", "vllm/vllm_flash_attn/_fa3.abi3.so": b"fa"}
VLLM_033 = Path.home() / ".cache/moegate/envs/_vllm-0.33.0/bin/python"


def _site(root: Path, libs: dict[str, bytes]) -> Path:
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    for name, data in libs.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _wheel(path: Path, libs: dict[str, bytes], package: bool = True) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        if package:
            z.writestr("vllm/__init__.py", "")
        for name, data in libs.items():
            z.writestr(name, data)
        z.writestr("vllm-1.dist-info/METADATA", "Name: vllm\nVersion: 1\n")
    return path


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_wheel_a_site_and_the_vllm_folder_give_the_same_record(tmp_path):
    want = {k: _sha(v) for k, v in LIBS.items()}
    assert record(_wheel(tmp_path / "v.whl", LIBS))["extensions"] == want
    site = _site(tmp_path / "site", LIBS)
    assert record(site)["extensions"] == want
    assert record(site / "vllm")["extensions"] == want


def test_a_python_is_asked_where_its_vllm_is_without_importing_it(tmp_path):
    site = _site(tmp_path / "site", LIBS)
    (site / "vllm" / "__init__.py").write_text("raise SystemExit('imported')\n")  # find_spec must not run it
    shim = tmp_path / "python"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    rec = record(shim)
    assert rec["package"] == str(site / "vllm") and rec["extensions"] == {k: _sha(v) for k, v in LIBS.items()}


@pytest.mark.skipif(not VLLM_033.is_file(), reason=f"needs the real vLLM 0.33.0 environment at {VLLM_033}")
def test_the_real_vllm_0_33_0_build_has_its_moe_extension_recorded():
    rec = record(VLLM_033)
    assert f"vllm/{MOE}.abi3.so" in rec["extensions"] and f"vllm/{C}.abi3.so" in rec["extensions"]


def test_a_build_without_a_vllm_package_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    shim = tmp_path / "python"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH={tmp_path / "empty"} exec {sys.executable} -S "$@"\n')
    shim.chmod(0o755)
    (tmp_path / "junk.whl").write_text("not a zip")
    cases = [
        (_wheel(tmp_path / "nopkg.whl", {}, package=False), "a wheel without a vllm package"),
        (tmp_path / "junk.whl", "not a wheel \\(not a zip archive\\)"),
        (tmp_path / "missing.whl", "no such wheel"),
        (tmp_path / "empty", "no vllm package"),
        (shim, "no vllm package in this Python"),
        (tmp_path / "nothing", "no such build"),
    ]
    for build, says in cases:
        with pytest.raises(BuildError, match=says) as info:
            record(build)
        assert "\n" not in str(info.value)


def _changes(moe=(), other=()):
    return CompiledChanges("b" * 40, "h" * 40, tuple([c.path for c in moe] + list(other)), tuple(moe), tuple(other),
                           (MOE,))  # fmt: skip


def _rec(libs):
    return {"build": "x", "extensions": {k: _sha(v) for k, v in libs.items()}}


ALIGN = Counted("csrc/moe/moe_align_sum_kernels.cu", f"a source of {MOE}", (MOE,))
ACT = Counted("csrc/activation_kernels.cu", f"defines {C} op silu_and_mul", (C,))


def test_no_compiled_change_and_identical_extensions_pass():
    v = compare(_rec(LIBS), _rec(LIBS), _changes())
    assert v.ok and v.line() == "PASS: no compiled source changed; the 3 extensions are identical in both builds"


def test_no_compiled_change_and_any_extension_differing_fails_naming_it():
    pr = dict(LIBS, **{"vllm/vllm_flash_attn/_fa3.abi3.so": b"other", "vllm/extra.so": b"x"})
    del pr[f"vllm/{C}.abi3.so"]
    v = compare(_rec(LIBS), _rec(pr), _changes())
    assert not v.ok
    assert v.reason.startswith("extensions differ where no compiled source changed: vllm/vllm_flash_attn/_fa3.abi3.so")
    assert f"vllm/{C}.abi3.so (base only)" in v.reason and "vllm/extra.so (PR only)" in v.reason


def test_a_moe_change_with_the_bases_moe_extension_fails_in_the_one_line():
    v = compare(_rec(LIBS), _rec(LIBS), _changes([ALIGN]))
    assert v.line() == (
        "FAIL: compiled MoE sources changed (csrc/moe/moe_align_sum_kernels.cu): this runner cannot build them"
    )


def test_a_moe_change_with_a_rebuilt_moe_extension_passes():
    pr = dict(LIBS, **{f"vllm/{MOE}.abi3.so": b"moe-pr"})
    v = compare(_rec(LIBS), _rec(pr), _changes([ALIGN]))
    assert v.ok and f"vllm/{MOE}.abi3.so {_sha(b'moe-pr')[:12]}" in v.reason


def test_a_c_op_change_needs_the_c_extension_rebuilt_not_only_the_moe_one():
    pr = dict(LIBS, **{f"vllm/{MOE}.abi3.so": b"moe-pr"})
    v = compare(_rec(LIBS), _rec(pr), _changes([ALIGN, ACT]))
    assert v.line() == "FAIL: compiled MoE sources changed (csrc/activation_kernels.cu): this runner cannot build them"
    pr[f"vllm/{C}.abi3.so"] = b"c-pr"
    assert compare(_rec(LIBS), _rec(pr), _changes([ALIGN, ACT])).ok


def test_a_moe_extension_that_changed_though_no_moe_source_did_fails():
    pr = dict(LIBS, **{f"vllm/{MOE}.abi3.so": b"moe-other"})
    v = compare(_rec(LIBS), _rec(pr), _changes(other=["csrc/attention/paged.cu"]))
    assert not v.ok and v.reason.startswith("the MoE extension differs though no source it compiles from changed")


def test_another_kernels_change_passes_with_the_moe_extensions_identical():
    pr = dict(LIBS, **{f"vllm/{C}.abi3.so": b"c-other"})
    v = compare(_rec(LIBS), _rec(pr), _changes(other=["csrc/attention/paged.cu"]))
    assert v.ok and "(csrc/attention/paged.cu)" in v.reason


def test_a_long_list_of_files_stays_one_line():
    many = [Counted(f"csrc/moe/k{i}.cu", "a source", (MOE,)) for i in range(14)]
    line = compare(_rec(LIBS), _rec(LIBS), _changes(many)).line()
    assert "\n" not in line and "csrc/moe/k9.cu and 4 more)" in line


def test_the_record_is_independent_of_where_the_site_lies(tmp_path):
    a, b = _site(tmp_path / "a", LIBS), _site(tmp_path / "b" / "deeper", LIBS)
    assert record(a)["extensions"] == record(b)["extensions"]
