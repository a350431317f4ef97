"""Which compiled sources a vLLM pull request changed, and which of them the fused-MoE ops compile from.

``compiled_changes(repo, base, head)`` diffs the merge base of ``base`` and ``head`` against ``head``
(``git diff base...head``: what the pull request itself changed) and sorts each changed file:

- **MoE** (counted): a file the fused-MoE ops compile from at either commit (``moegate.builds.sources``:
  the ``_moe_C`` target's sources and what they include, the ``_C`` ops the fused MoE calls), any CMake file
  (``CMakeLists.txt``, ``cmake/``, ``*.cmake``), ``setup.py``, and a requirements file (``requirements/``,
  ``pyproject.toml``) whose ``torch`` or ``triton`` requirement changed;
- **other compiled**: any other changed file under ``csrc/`` (another kernel: ``csrc/attention``);
- everything else is Python, docs, tests: no compiled source.

A counted file names the extension targets it reaches; a CMake file, ``setup.py`` and a torch or Triton pin reach
the ``_moe_C`` target (rebuilding it from the PR's tree takes their change in). Both commits are read from git
(``GitTree``): nothing is checked out, the working tree is not looked at.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moegate.builds.cmake import CMakeError
from moegate.builds.sources import CSRC, GitTree, MoeSources, Tree, moe_sources

BUILD_FILES = ("setup.py",)
REQUIREMENT_FILES = re.compile(r"^(requirements/.*\.(txt|in)|pyproject\.toml)$")
PINNED = ("torch", "triton")
"""Packages whose version change changes what the extensions compile against (torch's headers, ABI) or run with."""
_REQ = re.compile(
    rf"""^[ \t"']*({"|".join(PINNED)})(?![\w.-])[ \t]*(\[[^\]\n]*\])?[ \t]*([^#"',\n]*)""", re.IGNORECASE | re.MULTILINE
)


class ChangesError(ValueError):
    """Bad input: one line (not a git repository, an unknown commit, not a vLLM tree)."""


@dataclass(frozen=True)
class Counted:
    path: str
    why: str
    targets: tuple[str, ...]


@dataclass(frozen=True)
class CompiledChanges:
    base: str
    """The merge base, a full SHA."""
    head: str
    changed: tuple[str, ...]
    moe: tuple[Counted, ...]
    other: tuple[str, ...]
    """Compiled sources that changed and that the fused-MoE ops do not compile from."""
    moe_targets: tuple[str, ...] = field(default=())
    """The ``_moe_C`` extension targets of the tree (head's, else base's)."""

    @property
    def compiled(self) -> bool:
        return bool(self.moe or self.other)

    def moe_paths(self) -> list[str]:
        return [c.path for c in self.moe]

    def unbuilt(self, rebuilt: tuple[str, ...] | list[str]) -> list[str]:
        """The counted files whose change a build that rebuilt ``rebuilt`` (extension targets) does not contain."""
        return [c.path for c in self.moe if not set(c.targets) <= set(rebuilt)]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompiledChanges:
        try:
            return cls(
                base=str(data["base"]),
                head=str(data["head"]),
                changed=tuple(data["changed"]),
                moe=tuple(Counted(c["path"], c["why"], tuple(c["targets"])) for c in data["moe"]),
                other=tuple(data["other"]),
                moe_targets=tuple(data.get("moe_targets", ())),
            )
        except (KeyError, TypeError) as exc:
            raise ChangesError(f"not a compiled-changes record (missing or malformed {exc})") from None


def _git(repo: str | Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise ChangesError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"git {' '.join(args)} failed")
    return r.stdout


def resolve(repo: str | Path, rev: str) -> str:
    """The full SHA of commit ``rev`` in ``repo``; ``ChangesError`` (one line) where either is not there."""
    if not Path(repo).is_dir():
        raise ChangesError(f"{repo}: no such folder")
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--git-dir"], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise ChangesError(f"{repo}: not a git repository")
    r = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0 or not r.stdout.strip():
        raise ChangesError(f"{repo}: no commit {rev}")
    return r.stdout.strip()


def requirement_pins(text: str) -> list[str]:
    """The torch and Triton requirements of a requirements file or pyproject.toml, as written (spaces dropped)."""
    out = []
    for m in _REQ.finditer(text):
        spec = re.sub(r"\s+", "", m.group(3)).split(";")[0]
        out.append(f"{m.group(1).lower()}{spec}")
    return sorted(set(out))


def _pin_change(base: Tree, head: Tree, path: str) -> str | None:
    before, after = requirement_pins(base.read(path) or ""), requirement_pins(head.read(path) or "")
    if before == after:
        return None
    return f"{', '.join(before) or 'no torch/triton pin'} -> {', '.join(after) or 'no torch/triton pin'}"


def is_cmake(path: str) -> bool:
    return Path(path).name == "CMakeLists.txt" or path.startswith("cmake/") or path.endswith(".cmake")


def classify(changed: list[str], base: Tree, head: Tree, sources: list[MoeSources]) -> tuple[list[Counted], list[str]]:
    """Sort changed paths into counted (MoE) and other compiled sources (see the module's docstring)."""
    moe_targets = sorted({t.target for s in sources for t in s.moe_targets})
    counted: list[Counted] = []
    other: list[str] = []
    for path in changed:
        hits = [(s.reasons[path], s.targets[path]) for s in sources if path in s.reasons]
        if hits:
            targets = sorted({t for _, ts in hits for t in ts})
            counted.append(Counted(path, hits[-1][0], tuple(targets)))
        elif is_cmake(path):
            counted.append(Counted(path, "a CMake file", tuple(moe_targets)))
        elif path in BUILD_FILES:
            counted.append(Counted(path, "vLLM's build script", tuple(moe_targets)))
        elif REQUIREMENT_FILES.match(path) and (pin := _pin_change(base, head, path)):
            counted.append(Counted(path, f"a torch or Triton requirement changed: {pin}", tuple(moe_targets)))
        elif path.startswith(CSRC + "/"):
            other.append(path)
    return counted, other


def compiled_changes(repo: str | Path, base: str, head: str) -> CompiledChanges:
    """What the pull request from ``base`` to ``head`` changed in compiled sources (see the module's docstring)."""
    head_sha = resolve(repo, head)
    base_sha = resolve(repo, base)
    merge_base = _git(repo, "merge-base", base_sha, head_sha).strip()
    changed = [
        p for p in _git(repo, "diff", "--name-only", "--no-renames", "-z", merge_base, head_sha).split("\0") if p
    ]
    trees = [GitTree(repo, merge_base), GitTree(repo, head_sha)]
    sources = []
    problems = []
    for tree in trees:
        try:
            sources.append(moe_sources(tree))
        except CMakeError as exc:
            problems.append(f"{tree.commit[:12]}: {exc}")
    if not sources:
        raise ChangesError(f"{repo}: not a vLLM tree at either commit ({'; '.join(problems)})")
    counted, other = classify(changed, trees[0], trees[1], sources)
    targets = tuple(sorted({t.target for s in sources for t in s.moe_targets}))
    return CompiledChanges(merge_base, head_sha, tuple(changed), tuple(counted), tuple(other), targets)
