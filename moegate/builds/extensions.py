"""A build's compiled extensions by sha256, and the rule two builds' records must keep.

``record(build)`` hashes every ``*.so`` under a build's ``vllm`` package. A build is a wheel (its members are
read from the archive; nothing is installed), a folder (a site that holds ``vllm/``, or the ``vllm`` package
itself), or a Python interpreter (its ``vllm`` found with ``importlib.util.find_spec``, which locates the
package without importing it). The record's keys are paths from the package's parent: ``vllm/_C....so``.

``compare(base, pr, changes)`` is the rule, in order, each clause with its reason:

1. compiled MoE sources changed and an extension one of them reaches (``CompiledChanges``: the ``_moe_C``
   target, or the ``_C`` target of an op the fused MoE calls) is the base's, or absent, in the PR build: FAIL, in
   one line, ``compiled MoE sources changed (FILES): this runner cannot build them``, FILES those not contained;
2. compiled MoE sources changed and every extension they reach is the PR build's own: PASS;
3. no MoE source changed and the MoE extension differs: FAIL (binaries nobody can name);
4. no compiled source changed and an extension differs, or is in one build only: FAIL, naming each;
5. compiled sources changed that the MoE ops do not compile from: PASS, the MoE extensions identical (the others
   are not held equal: the precompiled build may or may not hold the change, and the gate tests none of it);
6. otherwise PASS: no compiled source changed, every extension identical.
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moegate.builds.changes import CompiledChanges
from moegate.builds.sources import is_moe_target
from moegate.core.hashing import CHUNK, bytes_sha256, sha256_file

PACKAGE = "vllm"
MAX_FILES = 10
"""A FAIL line names at most this many files, then how many more."""


class BuildError(ValueError):
    """A build whose extensions cannot be read: one line."""


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}: {self.reason}"


def is_moe_extension(key: str) -> bool:
    return is_moe_target(Path(key).name.split(".")[0])


def _from_wheel(path: Path) -> dict[str, str]:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if f"{PACKAGE}/__init__.py" not in names:
                raise BuildError(f"{path}: a wheel without a {PACKAGE} package (no {PACKAGE}/__init__.py)")
            out = {}
            for name in sorted(n for n in names if n.startswith(f"{PACKAGE}/") and n.endswith(".so")):
                with archive.open(name) as fh:
                    out[name] = bytes_sha256(iter(lambda: fh.read(CHUNK), b""))
            return out
    except zipfile.BadZipFile:
        raise BuildError(f"{path}: not a wheel (not a zip archive)") from None


def _from_package(package: Path) -> dict[str, str]:
    return {
        p.relative_to(package.parent).as_posix(): sha256_file(p) for p in sorted(package.rglob("*.so")) if p.is_file()
    }


def package_dir(build: str | os.PathLike[str]) -> Path:
    """The ``vllm`` package folder of a site, a package folder or an interpreter; ``BuildError`` where there is none."""
    path = Path(build)
    if path.is_dir():
        if (path / PACKAGE / "__init__.py").is_file():
            return path / PACKAGE
        if path.name == PACKAGE and (path / "__init__.py").is_file():
            return path
        raise BuildError(f"{path}: no {PACKAGE} package (neither {PACKAGE}/__init__.py nor a {PACKAGE} folder)")
    if path.is_file() and os.access(path, os.X_OK):
        code = (
            "import importlib.util as u; s = u.find_spec('vllm'); "
            "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')"
        )
        try:
            r = subprocess.run([str(path), "-c", code], capture_output=True, text=True, timeout=120, check=False)
        except OSError as exc:
            raise BuildError(f"{path}: cannot run it ({exc.strerror})") from None
        found = r.stdout.strip() if r.returncode == 0 else ""
        if not found:
            raise BuildError(f"{path}: no {PACKAGE} package in this Python")
        return Path(found)
    raise BuildError(f"{path}: no such build (a wheel, a site or {PACKAGE} folder, or a Python)")


def record(build: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"build": ..., "extensions": {"vllm/....so": sha256}}`` for a wheel, a folder or an interpreter."""
    path = Path(build)
    if path.suffix == ".whl":
        if not path.is_file():
            raise BuildError(f"{path}: no such wheel")
        return {"build": str(path), "kind": "wheel", "extensions": _from_wheel(path)}
    package = package_dir(path)
    return {"build": str(path), "kind": "folder", "package": str(package), "extensions": _from_package(package)}


def _names(paths: list[str]) -> str:
    shown = ", ".join(paths[:MAX_FILES])
    return shown + (f" and {len(paths) - MAX_FILES} more" if len(paths) > MAX_FILES else "")


def cannot_build_line(paths: list[str]) -> str:
    """The verdict's one line where the PR build does not contain a compiled MoE change."""
    return f"compiled MoE sources changed ({_names(paths)}): this runner cannot build them"


def differences(base: dict[str, str], pr: dict[str, str]) -> list[str]:
    out = [f"{k} (sha256 {base[k][:12]} -> {pr[k][:12]})" for k in sorted(base.keys() & pr.keys()) if base[k] != pr[k]]
    out += [f"{k} (base only)" for k in sorted(base.keys() - pr.keys())]
    out += [f"{k} (PR only)" for k in sorted(pr.keys() - base.keys())]
    return out


def target_of(key: str) -> str:
    """The extension target a library was built as: ``vllm/_moe_C_stable_libtorch.abi3.so`` -> its first name part."""
    return Path(key).name.split(".")[0]


def compare(base: dict[str, Any], pr: dict[str, Any], changes: CompiledChanges) -> Verdict:
    """The rule of the module's docstring, its first clause that applies."""
    b, p = dict(base["extensions"]), dict(pr["extensions"])
    rebuilt = sorted({target_of(k) for k, v in p.items() if b.get(k) != v})
    if changes.moe:
        unbuilt = changes.unbuilt(rebuilt)
        if unbuilt:
            return Verdict(False, cannot_build_line(unbuilt))
        own = ", ".join(f"{k} {v[:12]}" for k, v in sorted(p.items()) if target_of(k) in rebuilt)
        return Verdict(True, f"compiled MoE sources changed ({len(changes.moe)} files); the PR build's extensions"
                             f" they reach are its own ({own})")  # fmt: skip
    moe = [d for d in differences(b, p) if is_moe_extension(d.split(" ")[0])]
    if moe:
        return Verdict(False, f"the MoE extension differs though no source it compiles from changed: {_names(moe)}")
    if not changes.compiled:
        diff = differences(b, p)
        if diff:
            return Verdict(False, f"extensions differ where no compiled source changed: {_names(diff)}")
        return Verdict(True, f"no compiled source changed; the {len(b)} extensions are identical in both builds")
    return Verdict(
        True,
        f"compiled sources changed that the fused-MoE ops do not compile from ({_names(list(changes.other))});"
        " the MoE extensions are identical in both builds",
    )
