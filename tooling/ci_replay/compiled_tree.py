"""The compiled-source cases' vLLM: the step tests' tree (tests/support/vllm_tree.py, vLLM 0.33.0's CMakeLists-driven
source lists) with two stand-ins (tooling/ci_replay/README.md says why): ``SETUP_PY``, a vLLM-shaped package whose
build copies the pinned wheel's ``vllm/**/*.so`` from ``VLLM_PRECOMPILED_WHEEL_LOCATION`` as vLLM's does with
``VLLM_USE_PRECOMPILED=1``; ``publish``, the merge base's wheel in a ``file://`` index of wheels.vllm.ai's layout,
which ``moegate builds pin`` reads through ``MOEGATE_PRECOMPILED_INDEX``."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

from tests.support.vllm_tree import FILES as VLLM_TREE

VARIANT = "cu130"  # the caller's PRECOMPILED_VARIANT
EXTENSIONS = ("vllm/_C_stable_libtorch.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so")
WHEEL = "vllm-0.33.0-cp38-abi3-manylinux1_x86_64.whl"

SETUP_PY = '''"""ci-replay stand-in for vLLM's setup.py: the compiled extensions come from the pinned wheel."""
import io
import os
import urllib.request
import zipfile
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py


class precompiled_build_py(build_py):
    def run(self):
        super().run()
        if os.environ.get("VLLM_USE_PRECOMPILED") != "1":
            raise SystemExit("this vLLM stand-in builds only over precompiled binaries (VLLM_USE_PRECOMPILED=1)")
        location = os.environ["VLLM_PRECOMPILED_WHEEL_LOCATION"]
        with (urllib.request.urlopen(location) if "://" in location else open(location, "rb")) as src:
            data = src.read()
        with zipfile.ZipFile(io.BytesIO(data)) as wheel:
            for name in wheel.namelist():
                if name.startswith("vllm/") and name.endswith(".so"):
                    target = Path(self.build_lib, name)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(wheel.read(name))
                    print(f"precompiled: {name} from {location}")


setup(name="vllm", version="0.33.0", packages=find_namespace_packages(include=["vllm", "vllm.*"]),
      cmdclass={"build_py": precompiled_build_py})
'''
PYPROJECT = '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n'


def tree() -> dict[str, str]:
    """The step tests' vLLM tree, its build the stand-in's."""
    return {**VLLM_TREE, "setup.py": SETUP_PY, "pyproject.toml": PYPROJECT}


def publish(index: Path, commit: str, variant: str = VARIANT) -> Path:
    """``commit``'s wheel in ``index`` as wheels.vllm.ai lays it out (its extensions' bytes from the commit)."""
    wheel = index / commit / variant / WHEEL
    meta = index / commit / variant / "vllm" / "metadata.json"
    meta.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "")
        for name in EXTENSIONS:
            z.writestr(name, b"\x7fELF" + hashlib.sha256(f"{commit}:{name}".encode()).digest() * 64)
    entry = {"package_name": "vllm", "platform_tag": "manylinux1_x86_64", "path": f"../{WHEEL}"}
    meta.write_text(json.dumps([entry]))
    return wheel
