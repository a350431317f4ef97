"""Build vLLM's MoE extension from a source tree with vLLM's own CMake text, and put it into a build.

vLLM's full configure cannot run without a network: besides CUTLASS (``FetchContent``, or
``VLLM_CUTLASS_SRC_DIR``), it fetches DeepGEMM, DeepSelect, FlashKDA, FlashMLA, MSA (fmha_sm100), QuTLASS,
tml-fa4, Triton's triton_kernels and vLLM's flash-attention, each a git repository, and it configures every
extension (``_C``'s Machete and Marlin generators included) to build any one. So this module writes a CMake
project of its own from the tree's ``CMakeLists.txt``, unmodified text cut at statement boundaries:

- the **prelude**: every statement before ``include(FetchContent)`` (the compiler and Python checks, torch, the
  CUDA architectures, the GPU flags: ``get_torch_gpu_compiler_flags``, ``--compress-mode=size``);
- ``CUTLASS_INCLUDE_DIR`` (and ``CUTLASS_TOOLS_UTIL_INCLUDE_DIR``) pointing at a CUTLASS tree given here, where the
  full configure would have fetched it (the MoE target includes CUTLASS's headers: ``moe_permute``);
- the ``_moe_C`` target's **block** (``moegate.builds.cmake``): its sources, the Marlin MoE generator it runs,
  ``define_extension_target`` and its definitions.

What the skipped statements would have added: the ``_C`` block appends ``-DENABLE_*`` / ``-DVLLM_ENABLE_*`` macros
to ``VLLM_GPU_FLAGS`` before the MoE target takes them; no source the MoE target compiles reads one (0.33.0,
checked by ``tests/unit/builds/test_moe_build.py`` against the real tree), so its objects are the same code.

The project sits in ``BUILD/project`` beside links to the tree's ``csrc`` and ``cmake`` (the target's sources and
``define_extension_target``'s ``csrc`` include path are relative to it); ``BUILD/cmake`` is CMake's build folder,
reused by the next build (an unchanged file is not compiled again; a compiler cache, ``--launcher ccache``, keeps
objects across build folders). ``install`` puts the library into a site or a wheel in place of the one there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from moegate.builds.cmake import CMakeError, commands, target_names, target_sources
from moegate.builds.sources import CMAKELISTS, is_moe_target
from moegate.core.golden_files import atomic_write
from moegate.core.hashing import record_line

LINKS = ("csrc", "cmake")


class BuildError(ValueError):
    """A build that cannot be made or put in place: one line."""


@dataclass(frozen=True)
class Built:
    target: str
    library: Path
    configure_s: float
    build_s: float


def prelude_end(text: str) -> int:
    """Offset of vLLM's ``include(FetchContent)``: everything before it configures without a network."""
    for cmd in commands(text):
        if cmd.name == "include" and cmd.args and cmd.args[0] == "FetchContent":
            return cmd.start
    raise CMakeError(f"{CMAKELISTS} has no include(FetchContent): cannot tell its prelude from its extensions")


def moe_targets(text: str) -> list[str]:
    names = [n for n in target_names(text) if is_moe_target(n)]
    if not names:
        raise CMakeError(f"{CMAKELISTS} defines no _moe_C extension")
    return names


def project_text(text: str, cutlass: Path | None) -> str:
    """The CMake project of the module's docstring, from the tree's CMakeLists.txt ``text``."""
    parts = [
        text[: prelude_end(text)].rstrip(),
        "",
        "# moegate: CUTLASS's headers, where the full configure fetches them",
    ]
    if cutlass is not None:
        parts.append(f'set(CUTLASS_INCLUDE_DIR "{cutlass / "include"}")')
        parts.append(f'set(CUTLASS_TOOLS_UTIL_INCLUDE_DIR "{cutlass / "tools" / "util" / "include"}")')
    for name in moe_targets(text):
        start, end = target_sources(text, name).block
        parts += ["", f"# moegate: the {name} block of vLLM's {CMAKELISTS}, as written", text[start:end]]
    return "\n".join(parts) + "\n"


def needs_cutlass(text: str) -> bool:
    return any("CUTLASS_INCLUDE_DIR" in text[slice(*target_sources(text, n).block)] for n in moe_targets(text))


def cutlass_revision(text: str) -> str:
    for cmd in commands(text):
        if cmd.name == "set" and len(cmd.args) >= 2 and cmd.args[0] == "CUTLASS_REVISION":
            return cmd.args[1]
    return "the one its CMakeLists.txt fetches"


def write_project(src: Path, build: Path, cutlass: Path | None) -> Path:
    """``BUILD/project``: the generated CMakeLists.txt and links to the tree's folders; returns it."""
    cmakelists = src / CMAKELISTS
    if not cmakelists.is_file():
        raise BuildError(f"{src}: no {CMAKELISTS}: not a vLLM source tree")
    text = cmakelists.read_text()
    try:
        if cutlass is None and needs_cutlass(text):
            raise BuildError(
                f"the MoE extension includes CUTLASS's headers: give --cutlass DIR (a CUTLASS tree,"
                f" {cutlass_revision(text)} as this {CMAKELISTS} pins it) or set VLLM_CUTLASS_SRC_DIR"
            )
        body = project_text(text, cutlass)
    except CMakeError as exc:
        raise BuildError(f"{cmakelists}: {exc}") from None
    if cutlass is not None and not (cutlass / "include" / "cutlass").is_dir():
        raise BuildError(f"{cutlass}: not a CUTLASS tree (no include/cutlass)")
    project = build / "project"
    project.mkdir(parents=True, exist_ok=True)
    for name in LINKS:
        link = project / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to((src / name).resolve(), target_is_directory=True)
    atomic_write(project / CMAKELISTS, body)
    return project


def cuda_root() -> str | None:
    """The CUDA toolkit: ``CUDA_HOME``, ``CUDA_PATH``, else ``/usr/local/cuda`` where it has ``bin/nvcc``."""
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if candidate and Path(candidate, "bin", "nvcc").is_file():
            return candidate
    return None


def _run(cmd: Sequence[str], log: Path, env: dict[str, str]) -> float:
    t0 = time.monotonic()
    with log.open("a") as fh:
        fh.write("$ " + " ".join(cmd) + "\n")
        fh.flush()
        r = subprocess.run(list(cmd), stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
    if r.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise BuildError(f"{cmd[0]} {cmd[1]} exited {r.returncode} ({log}): {tail[0][:300]}")
    return time.monotonic() - t0


def build_moe(
    src: str | os.PathLike[str],
    build: str | os.PathLike[str],
    *,
    arch: str,
    python: str,
    cutlass: str | os.PathLike[str] | None = None,
    launcher: str | None = None,
    build_type: str = "Release",
    jobs: int | None = None,
    cmake: str = "cmake",
    cuda_home: str | None = None,
    cmake_args: Sequence[str] = (),
    configure_only: bool = False,
) -> list[Built]:
    """Configure (once per build folder) and build every ``_moe_C`` target of tree ``src`` for CUDA ``arch``
    (``TORCH_CUDA_ARCH_LIST``'s form: ``9.0``, ``8.9``); the log is ``BUILD/build.log``."""
    src_p, build_p = Path(src).resolve(), Path(build).resolve()
    cutlass = cutlass or os.environ.get("VLLM_CUTLASS_SRC_DIR") or None
    project = write_project(src_p, build_p, Path(cutlass).resolve() if cutlass else None)
    if shutil.which(cmake) is None:
        raise BuildError(f"{cmake}: not found (CMake 3.26 or newer builds vLLM's extensions)")
    log = build_p / "build.log"
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=arch)
    cuda = cuda_home or cuda_root()
    cmake_dir = build_p / "cmake"
    configure = [cmake, "-G", "Ninja", "-S", str(project), "-B", str(cmake_dir), f"-DCMAKE_BUILD_TYPE={build_type}"]
    configure += ["-DVLLM_TARGET_DEVICE=cuda", f"-DVLLM_PYTHON_EXECUTABLE={python}"]
    if cuda:  # as vLLM's setup.py passes it: torch's CMake finds the toolkit from the compiler's folder
        configure += [f"-DCMAKE_CUDA_COMPILER={cuda}/bin/nvcc", f"-DCUDA_TOOLKIT_ROOT_DIR={cuda}"]
        env["CUDA_HOME"] = cuda
    if launcher:
        configure += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER={launcher}" for lang in ("C", "CXX", "CUDA")]
    configure_s = _run([*configure, *cmake_args], log, env)
    targets = moe_targets((src_p / CMAKELISTS).read_text())
    if configure_only:
        return [Built(t, Path(), configure_s, 0.0) for t in targets]
    out = []
    for target in targets:
        cmd = [cmake, "--build", str(cmake_dir), "--target", target]
        build_s = _run([*cmd, "-j", str(jobs)] if jobs else cmd, log, env)
        found = sorted(cmake_dir.glob(f"{target}.*so"))
        if len(found) != 1:
            raise BuildError(f"{cmake_dir}: {len(found)} libraries named {target}.*so after the build, want 1")
        out.append(Built(target, found[0], configure_s, build_s))
        configure_s = 0.0
    return out


def install(
    library: str | os.PathLike[str], into: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Put ``library`` in place of the build's ``vllm/<its name>``: in a site (or the ``vllm`` folder) by an atomic
    rename, or in a wheel, written anew into ``out_dir`` with its RECORD's line for it. Returns what was written."""
    lib, dest = Path(library), Path(into)
    if not lib.is_file():
        raise BuildError(f"{lib}: no such library")
    if dest.suffix == ".whl":
        return _into_wheel(lib, dest, Path(out_dir) if out_dir else None)
    package = dest if dest.name == "vllm" else dest / "vllm"
    target = package / lib.name
    if not target.is_file():
        raise BuildError(f"{package}: no {lib.name} to replace (not a site of a vLLM with this extension)")
    fd, tmp = tempfile.mkstemp(dir=package, prefix=f".{lib.name}.")
    os.close(fd)
    shutil.copyfile(lib, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def _into_wheel(lib: Path, wheel: Path, out_dir: Path | None) -> Path:
    if out_dir is None or out_dir.resolve() == wheel.parent.resolve():
        raise BuildError(f"{wheel}: a wheel is written anew: give an output folder other than its own")
    member = f"vllm/{lib.name}"
    try:
        with zipfile.ZipFile(wheel) as src:
            names = src.namelist()
            if member not in names:
                raise BuildError(f"{wheel}: no {member} to replace")
            records = [n for n in names if n.endswith(".dist-info/RECORD")]
            if len(records) != 1:
                raise BuildError(f"{wheel}: {len(records)} RECORD files, want 1")
            out_dir.mkdir(parents=True, exist_ok=True)
            final = out_dir / wheel.name
            tmp = out_dir / f".{wheel.name}.tmp"
            data = lib.read_bytes()
            with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as dst:
                for info in src.infolist():
                    if info.filename == member:
                        dst.writestr(info, data)
                    elif info.filename == records[0]:
                        lines = [
                            record_line(member, data) if line.split(",", 1)[0] == member else line
                            for line in src.read(info).decode().splitlines()
                        ]
                        dst.writestr(info, "\n".join(lines) + "\n")
                    else:
                        dst.writestr(info, src.read(info))
    except zipfile.BadZipFile:
        raise BuildError(f"{wheel}: not a wheel (not a zip archive)") from None
    os.replace(tmp, final)
    return final
