"""The replay's stand-ins (README.md, "Stand-ins"): the copy of the checkout, its workflows, the
torch index, the interpreters, the binaries on PATH, and the pinned actions supplied offline."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from moegate.paths import ROOT
from tooling.ci_replay.common import PINNED, STUBBED_ACTIONS, ReplayError, _run

# --- the copy and its stand-ins ----------------------------------------------------------


def copy_checkout(dest: Path) -> str:
    """The files `git push` would send, into `dest`, as a fresh one-commit repository; the source revision."""
    files = _run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"]).stdout.split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, target)
    head = _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = _run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=normal"]).stdout.strip()
    return head + (" + uncommitted changes" if dirty else "")


def _commit(repo: Path, message: str) -> str:
    git = ["git", "-C", str(repo), "-c", "user.name=ci-replay", "-c", "user.email=ci-replay@localhost"]
    _run([*git, "add", "-A"])
    _run([*git, "commit", "-q", "--allow-empty", "-m", message])
    return _run(["git", "-C", str(repo), "rev-parse", "HEAD"]).stdout.strip()


def rewrite(text: str, old: str, new: str, why: str, where: str, regex: bool = False) -> str:
    """One stand-in edit; a stand-in that no longer matches is an error, never a silent no-op."""
    changed, count = re.subn(old, new, text, flags=re.MULTILINE) if regex else (text.replace(old, new), text.count(old))
    if count == 0:
        raise ReplayError(f"stand-in '{why}' no longer applies: {old!r} not in {where}")
    return changed


REPLAY_WORKFLOWS = ".nox/ci-replay"  # in the copy, ignored: act reads the called workflow there, no job sees it
PUBLIC_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
SELF_CHECKOUT = r"^ +(repository: \$\{\{ inputs\.moegate-repository \|\| github\.repository \}\}|ref: \$\{\{ inputs\.moegate-ref \}\})\n"


def replay_workflows(copy: Path, run_dir: Path, index: Path) -> Path:
    """The workflows as act runs them, stand-ins applied; the copy's own .github/workflows stay as committed.

    The jobs check the workflows themselves (the unit tier's workflow rules, zizmor and
    actionlint in lint), so the edited files live where no job reads them: gate.yml beside the
    copy (act's -W), moegate.yml in the copy's ignored .nox/ (act resolves `uses: ./...`
    from its working directory, and copies no ignored file into a job's workspace).
    """
    src = copy / ".github" / "workflows"
    gate, called = (src / "gate.yml").read_text(), (src / "moegate.yml").read_text()
    gate = rewrite(gate, "uses: $/.github/workflows/moegate.yml", f"uses: ./{REPLAY_WORKFLOWS}/moegate.yml",
                   "self-repository uses: $/ -> ./", "gate.yml")  # fmt: skip
    called = rewrite(
        called, SELF_CHECKOUT, "", "checkout of this repository -> act's local checkout", "moegate.yml", regex=True
    )
    gate = rewrite(gate, PUBLIC_TORCH_INDEX, index.as_uri(), "PyTorch CPU index -> file://", "gate.yml")
    called = rewrite(called, PUBLIC_TORCH_INDEX, index.as_uri(), "PyTorch CPU index -> file://", "moegate.yml")
    (copy / REPLAY_WORKFLOWS).mkdir(parents=True)
    (copy / REPLAY_WORKFLOWS / "moegate.yml").write_text(called)
    (run_dir / "workflows").mkdir()
    (run_dir / "workflows" / "gate.yml").write_text(gate)
    return run_dir / "workflows" / "gate.yml"


GSM8K_SOURCE = "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data"
GSM8K_SOURCE_ENV = "MOEGATE_GSM8K_SOURCE"
"""GitHub's raw-file host is not reachable here: `.ci/gsm8k` (``moegate fetch-gsm8k``) reads GSM8K's files from the
folder this variable names instead of its default, the authors' repository (``GSM8K_SOURCE``)."""


def torch_index(dest: Path, wheels: Iterable[Path]) -> list[str]:
    """A PEP 503 index on disk (file://) holding the CPU torch wheels found here; their names."""
    names = []
    (dest / "torch").mkdir(parents=True)
    for wheel in wheels:
        (dest / "torch" / wheel.name).symlink_to(wheel)
        names.append(wheel.name)
    links = "".join(f'<a href="{n}">{n}</a><br>\n' for n in names)
    (dest / "torch" / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    (dest / "index.html").write_text('<!DOCTYPE html><html><body><a href="torch/">torch</a></body></html>\n')
    return names


def _newest(paths: Iterable[Path]) -> Path | None:
    found = sorted(paths, key=lambda p: [int(n) for n in re.findall(r"\d+", p.name)])
    return found[-1] if found else None


def find_interpreter(version: str) -> Path | None:
    """An installed CPython `version` (3.11): pyenv's newest patch, else this Python if it is that version."""
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = _newest(p for p in pyenv.glob(f"{version}.*") if (p / "bin" / f"python{version}").exists())
    if found:
        return found
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return Path(sys.base_prefix)
    return None


def tool_cache(act_dir: Path, want: str) -> str:
    """setup-python's tool-cache entry Python/<want>/x64 -> an installed interpreter of the same minor; its version."""
    minor = ".".join(want.split(".")[:2])
    prefix = find_interpreter(minor)
    if prefix is None:
        raise ReplayError(f"no Python {minor} installed here to stand in for {want} (setup-python's tool cache)")
    entry = act_dir / "tool_cache" / "Python" / want
    entry.mkdir(parents=True)
    (entry / "x64").symlink_to(prefix)
    (entry / "x64.complete").write_text("")
    return _run(
        [str(prefix / "bin" / f"python{minor}"), "-c", "import platform; print(platform.python_version())"]
    ).stdout.strip()


SUDO = """#!/bin/sh
# ci-replay stand-in: hosted runners give passwordless sudo; here nothing runs as root
echo "ci-replay: sudo $* (not run on this host)" >&2
"""


def stand_in_bin(dest: Path, copy: Path, gsm8k: Path) -> dict[str, str]:
    """`sudo` (stubbed) and `python3.12` (the hosted image's system Python 3.12); GSM8K's source (``host_env``)."""
    dest.mkdir(parents=True)
    (dest / "sudo").write_text(SUDO)
    (dest / "sudo").chmod(0o755)
    rewrite((copy / ".ci" / "gsm8k").read_text(), GSM8K_SOURCE_ENV, "", "GSM8K source -> local copy", ".ci/gsm8k")
    made = {"sudo": "stub (prints, runs nothing)", GSM8K_SOURCE_ENV: f"GSM8K's files from {gsm8k.as_uri()}"}
    py312 = find_interpreter("3.12")
    if py312:
        (dest / "python3.12").symlink_to(py312 / "bin" / "python3.12")
        made["python3.12"] = str(py312 / "bin" / "python3.12")
    return made


# --- the pinned actions, offline ----------------------------------------------------------


UPLOAD_STUB_ACTION = """name: upload-artifact (ci-replay stand-in)
description: keeps the files actions/upload-artifact would upload in the replay's artifact folder
inputs:
  name: {default: artifact}
  path: {required: true}
  if-no-files-found: {default: warn}
  retention-days: {default: "0"}
  compression-level: {default: "6"}
  overwrite: {default: "false"}
  include-hidden-files: {default: "false"}
runs:
  using: composite
  steps:
    - shell: bash
      env:
        NAME: ${{ inputs.name }}
        PATHS: ${{ inputs.path }}
        IF_NONE: ${{ inputs.if-no-files-found }}
        OVERWRITE: ${{ inputs.overwrite }}
        HIDDEN: ${{ inputs.include-hidden-files }}
      run: python3 "$GITHUB_ACTION_PATH/upload.py"
"""

UPLOAD_STUB_SCRIPT = '''"""upload-artifact's file selection (globs, `!` exclusions, hidden files) and layout (relative to the search
paths' common ancestor: a directory's files without it), copied instead of uploaded."""
import glob, os, shutil, sys
from pathlib import Path

name, paths = os.environ["NAME"], [p.strip() for p in os.environ["PATHS"].splitlines() if p.strip()]
hidden = os.environ["HIDDEN"] == "true"
dest = Path(os.environ["MOEGATE_REPLAY_ARTIFACTS"]) / name
if dest.exists() and os.environ["OVERWRITE"] != "true":
    sys.exit(f"::error::an artifact named {name} already exists in this run")
shutil.rmtree(dest, ignore_errors=True)
def files(pattern):
    for hit in glob.glob(pattern, recursive=True, include_hidden=hidden):
        p = Path(hit)
        yield from (q for q in p.rglob("*") if q.is_file()) if p.is_dir() else ([p] if p.is_file() else [])
chosen = {f for pat in paths if not pat.startswith("!") for f in files(pat)}
chosen -= {f for pat in paths if pat.startswith("!") for f in files(pat[1:])}
if not hidden:
    chosen = {f for f in chosen if not any(part.startswith(".") for part in f.parts)}
if not chosen:
    mode = os.environ["IF_NONE"]
    print(f"::{'error' if mode == 'error' else 'warning'}::no files found for artifact {name}") if mode != "ignore" else None
    sys.exit(1 if mode == "error" else 0)
def search_path(pattern):  # the path up to its first wildcard, as @actions/glob's getSearchPaths
    parts = Path(pattern).parts
    cut = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
    return Path(os.path.abspath(Path(*parts[:cut]) if cut else "."))
found = sorted({search_path(p) for p in paths if not p.startswith("!")})
searched = [s for s in found if not any(o != s and o in s.parents for o in found)]
root = Path(os.path.commonpath(searched)) if len(searched) > 1 else searched[0]
if len(chosen) == 1 and len(searched) == 1 and Path(os.path.abspath(next(iter(chosen)))) == root:
    root = root.parent  # one file named as itself: no directory kept
for f in sorted(chosen):  # stored relative to the search paths' common ancestor, as upload-artifact stores them
    rel = Path(os.path.abspath(f)).relative_to(root)
    (dest / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(f, dest / rel)
print(f"ci-replay stand-in: artifact {name}: {len(chosen)} files kept in {dest}")
'''


DOWNLOAD_STUB_ACTION = """name: download-artifact (ci-replay stand-in)
description: copies artifacts this run kept in the replay's artifact folder, as actions/download-artifact lays them out
inputs:
  name: {default: ""}
  pattern: {default: ""}
  path: {default: "."}
  merge-multiple: {default: "false"}
  run-id: {default: ""}
  github-token: {default: ""}
runs:
  using: composite
  steps:
    - shell: bash
      env:
        NAME: ${{ inputs.name }}
        PATTERN: ${{ inputs.pattern }}
        DEST: ${{ inputs.path }}
        MERGE: ${{ inputs.merge-multiple }}
        RUN_ID: ${{ inputs.run-id }}
      run: python3 "$GITHUB_ACTION_PATH/download.py"
"""

DOWNLOAD_STUB_SCRIPT = '''"""download-artifact's layout: one named artifact into path, a pattern's each into path/<name> (or merged)."""
import fnmatch, os, shutil, sys
from pathlib import Path

kept = Path(os.environ["MOEGATE_REPLAY_ARTIFACTS"])
name, pattern, dest = os.environ["NAME"], os.environ["PATTERN"], Path(os.environ["DEST"])
if os.environ["RUN_ID"]:
    sys.exit(f"::error::ci-replay stand-in: no earlier run {os.environ['RUN_ID']} to download from")
if name:
    if not (kept / name).is_dir():
        sys.exit(f"::error::Artifact not found for name: {name}")
    shutil.copytree(kept / name, dest, dirs_exist_ok=True)
    print(f"ci-replay stand-in: artifact {name} into {dest}")
    sys.exit(0)
found = sorted(p for p in kept.iterdir() if p.is_dir() and fnmatch.fnmatch(p.name, pattern or "*")) if kept.is_dir() else []
for art in found:
    shutil.copytree(art, dest if os.environ["MERGE"] == "true" else dest / art.name, dirs_exist_ok=True)
print(f"ci-replay stand-in: {len(found)} artifacts matching {pattern or '*'} into {dest}")
'''


def _bare(path: Path) -> None:
    _run(["git", "init", "-q", "--bare", str(path)])


def offline_action(act_dir: Path, snapshots: Path, owner: str, repo: str, sha: str) -> str:
    """`<act_dir>/<owner>-<repo>.git` with refs/action-cache-offline/<sha>, as act's offline mode reads it; a note."""
    bare = act_dir / f"{owner}-{repo}.git"
    ref = f"refs/action-cache-offline/{sha}"
    if bare.exists():
        return "prepared"
    if (owner, repo) in STUBBED_ACTIONS:
        work = act_dir / f"_stub-{owner}-{repo}"
        work.mkdir()
        _run(["git", "init", "-q", str(work)])
        upload = repo == "upload-artifact"
        (work / "action.yml").write_text(UPLOAD_STUB_ACTION if upload else DOWNLOAD_STUB_ACTION)
        (work / ("upload.py" if upload else "download.py")).write_text(
            UPLOAD_STUB_SCRIPT if upload else DOWNLOAD_STUB_SCRIPT
        )
        stub = _commit(work, f"ci-replay stand-in for {owner}/{repo}@{sha}")
        _bare(bare)
        _run(["git", "-C", str(work), "push", "-q", str(bare), f"{stub}:{ref}"])
        shutil.rmtree(work)
        return f"stand-in (composite action {stub[:12]} under the pinned ref)"
    snap = snapshots / f"{owner}+{repo}" / "repo"
    if not snap.exists():
        raise ReplayError(f"no snapshot of {owner}/{repo} at {snap} (the search tool's fetch: github:{owner}/{repo})")
    if _run(["git", "-C", str(snap), "cat-file", "-t", sha], check=False).stdout.strip() != "commit":
        raise ReplayError(f"the snapshot of {owner}/{repo} lacks the pinned commit {sha}")
    # the pinned commit and whatever of its tree the snapshot holds (large files may be absent)
    listing = _run(["git", "-C", str(snap), "ls-tree", "-r", "-t", sha]).stdout.splitlines()
    objects = [sha, _run(["git", "-C", str(snap), "rev-parse", f"{sha}^{{tree}}"]).stdout.strip()]
    missing: list[str] = []
    for line in listing:
        meta, _, rel = line.partition("\t")
        obj = meta.split()[2]
        present = subprocess.run(["git", "-C", str(snap), "cat-file", "-e", obj], check=False).returncode == 0
        (objects if present else missing).append(obj if present else rel)
    _bare(bare)
    pack = subprocess.run(
        ["git", "-C", str(snap), "pack-objects", "--stdout"],
        input="\n".join(objects).encode(),
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["git", "-C", str(bare), "unpack-objects", "-q"], input=pack, check=True)
    _run(["git", "-C", str(bare), "update-ref", ref, sha])
    return "pinned commit" + (f"; absent from the snapshot: {', '.join(missing)}" if missing else ", complete")


def pinned_actions(root: Path) -> list[tuple[str, str, str]]:
    found: dict[tuple[str, str, str], None] = {}
    for path in sorted((root / ".github" / "workflows").glob("*.yml")):
        for m in PINNED.finditer(path.read_text()):
            found[(m.group(1), m.group(2), m.group(3))] = None
    return list(found)
