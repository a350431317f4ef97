"""The one small file ``lab/gpu/compiled.sh`` builds from on the device, made here:

    python3 -m lab.gpu.compiled_carry SDIST.tar.gz CUTLASS_DIR OUT.tar.xz

- vLLM's sdist cut to what its MoE extension's build reads: ``csrc/``, ``cmake/``, ``CMakeLists.txt``, ``setup.py``,
  ``pyproject.toml``, ``requirements/`` (0.33.0: 0.9 MB of xz out of the 47 MB sdist), under ``vllm/``;
- CUTLASS's headers (``include/``) from a CUTLASS tree, under ``cutlass/``: the MoE target includes them
  (``moe_permute``) and vLLM's configure would fetch them. 0.33.0's CMakeLists.txt pins v4.7.1; the vLLM 0.33.0 wheel
  carries a CUTLASS 4.8 tree (``vllm/third_party/fmha_sm100/cutlass``) that serves: the MoE sources use
  ``cutlass/array.h`` and ``cutlass/numeric_size.h`` only. The version it holds is printed and kept in the carry
  (``cutlass/VERSION``).

Nothing of either is committed here. The output is written whole (a temporary file, then a rename); bad input is one
line and exit 2.
"""

from __future__ import annotations

import argparse
import io
import lzma
import os
import re
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

KEEP = ("csrc/", "cmake/", "CMakeLists.txt", "setup.py", "pyproject.toml", "requirements/")


class CarryError(ValueError):
    """Bad input: one line."""


def cutlass_version(include: Path) -> str:
    text = (include / "cutlass" / "version.h").read_text(errors="replace")
    parts = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "?" for m in parts)


def carry(sdist: Path, cutlass: Path, out: Path) -> tuple[int, int, str]:
    """Write the carry; returns (vLLM files, CUTLASS files, CUTLASS version)."""
    include = cutlass / "include"
    if not (include / "cutlass" / "version.h").is_file():
        raise CarryError(f"{cutlass}: not a CUTLASS tree (no include/cutlass/version.h)")
    version = cutlass_version(include)
    try:
        src = tarfile.open(sdist)  # noqa: SIM115 (closed by the with below, once it is known to open)
    except tarfile.TarError:
        raise CarryError(f"{sdist}: not a readable sdist (not a tar archive)") from None
    except OSError as exc:
        raise CarryError(f"{sdist}: not a readable sdist ({exc.strerror})") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    n_vllm = n_cutlass = 0
    with src, lzma.open(tmp, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w") as dst:
        for member in src.getmembers():
            rest = member.name.partition("/")[2]
            if not member.isfile() or not rest.startswith(KEEP):
                continue
            data = src.extractfile(member)
            member.name = f"vllm/{rest}"
            dst.addfile(member, data)
            n_vllm += 1
        if not n_vllm or not any(m.name == "vllm/CMakeLists.txt" for m in dst.getmembers()):
            raise CarryError(f"{sdist}: no CMakeLists.txt under its top folder: not vLLM's sdist")
        for path in sorted(include.rglob("*")):
            if path.is_file():
                dst.add(path, arcname=f"cutlass/include/{path.relative_to(include).as_posix()}")
                n_cutlass += 1
        info = tarfile.TarInfo("cutlass/VERSION")
        payload = f"{version}\n".encode()
        info.size = len(payload)
        dst.addfile(info, io.BytesIO(payload))
    os.replace(tmp, out)
    return n_vllm, n_cutlass, version


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m lab.gpu.compiled_carry", description=(__doc__ or "").splitlines()[0])
    p.add_argument("sdist", type=Path, help="vLLM's sdist (vllm-0.33.0.tar.gz)")
    p.add_argument("cutlass", type=Path, help="a CUTLASS tree (a folder with include/cutlass)")
    p.add_argument("out", type=Path, help="the carry to write (.tar.xz)")
    opts = p.parse_args(argv)
    try:
        n_vllm, n_cutlass, version = carry(opts.sdist, opts.cutlass, opts.out)
    except CarryError as exc:
        print(f"compiled_carry: {exc}", file=sys.stderr)
        tmp = opts.out.with_name(f".{opts.out.name}.tmp")
        tmp.unlink(missing_ok=True)
        return 2
    size = opts.out.stat().st_size / 1e6
    print(f"{opts.out}: {n_vllm} vLLM files, {n_cutlass} CUTLASS {version} headers, {size:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
