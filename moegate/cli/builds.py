"""``moegate builds``: which binaries a vLLM pull request's builds hold, and whether they hold its compiled change.

    moegate builds changes --vllm-src DIR --base SHA --head SHA [--rebuilt TARGET,...] [--json FILE]
        the compiled sources the PR changed (merge base to head), each counted one with its reason; exit 1 with one
        line, ``compiled MoE sources changed (FILES): this runner cannot build them``, where the fused-MoE ops
        compile from a changed file and no rebuilt extension (``--rebuilt``, the targets the runner builds from the
        PR's tree) takes it in
    moegate builds hashes BUILD --json FILE
        the sha256 of every compiled extension (``vllm/**/*.so``) of a wheel, a site or a Python
    moegate builds compare --base FILE --pr FILE --changes FILE [--json FILE]
        PASS or FAIL: the two builds' records against what changed (``moegate.builds.extensions``)
    moegate builds pin --vllm-src DIR --commit SHA --variant cu130 [--index URL] [--env FILE]
        the published precompiled wheel of a commit (the merge base), as ``VLLM_PRECOMPILED_WHEEL_*=`` lines
    moegate builds rebuild-moe --vllm-src DIR --arch 8.9 --build-dir DIR [--into SITE|WHEEL [--out DIR]] ...
        vLLM's MoE extension built from the tree with vLLM's own CMake text (``moegate.builds.moe_build``)

Exit status: 0 done (PASS); 1 FAIL (a compiled MoE change the builds do not hold, extensions that differ, a build
that cannot be pinned or made); 2 bad input, one line (not a git repository, an unknown commit, a build with no
vllm package, an unreadable record). Files are written whole (a temporary file, then a rename).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from moegate.builds.changes import ChangesError, CompiledChanges, compiled_changes
from moegate.builds.extensions import BuildError, cannot_build_line, compare, record
from moegate.builds.moe_build import BuildError as MakeError
from moegate.builds.moe_build import build_moe, install
from moegate.builds.pin import INDEX, PinError, pin
from moegate.core.golden_files import atomic_write
from moegate.core.hashing import sha256_file


def _write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def page(verdict: str, base: dict[str, Any], pr: dict[str, Any], changes: CompiledChanges) -> str:
    """The report's page: the verdict, both builds' extensions side by side, the compiled sources that changed."""
    b, p = base["extensions"], pr["extensions"]
    lines = ["### Compiled extensions (moegate builds compare)", "", f"**{verdict}**", ""]
    where = f"Merge base `{changes.base[:12]}`, head `{changes.head[:12]}`"
    lines += [f"{where}; base build `{base.get('build')}`, PR build `{pr.get('build')}`.", ""]
    lines += ["| extension | base sha256 | PR sha256 | |", "| --- | --- | --- | --- |"]
    for key in sorted(b.keys() | p.keys()):
        same = "same" if b.get(key) == p.get(key) else "differs"
        lines.append(f"| `{key}` | `{b.get(key, '-')[:16]}` | `{p.get(key, '-')[:16]}` | {same} |")
    lines += ["", f"Compiled sources the fused-MoE ops compile from that changed: {len(changes.moe)}"]
    lines += [f"- `{c.path}`: {c.why} ({', '.join(c.targets)})" for c in changes.moe]
    if changes.other:
        lines += ["", f"Other compiled sources that changed: {', '.join(f'`{o}`' for o in changes.other)}"]
    return "\n".join(lines) + "\n"


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ChangesError(f"{path}: cannot read the {what} ({exc.strerror})") from None
    except json.JSONDecodeError:
        raise ChangesError(f"{path}: the {what} is not JSON") from None
    if not isinstance(data, dict):
        raise ChangesError(f"{path}: the {what} is not a JSON object")
    return data


def _targets(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moegate builds", description="the binaries of a vLLM pull request's builds")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("changes", help="the compiled sources a pull request changed, and which the MoE ops use")
    c.add_argument("--vllm-src", required=True, type=Path, help="a git checkout of vLLM holding both commits")
    c.add_argument("--base", required=True, help="the base (its merge base with --head is taken)")
    c.add_argument("--head", required=True, help="the pull request's head")
    c.add_argument("--rebuilt", type=_targets, default=[], help="extension targets rebuilt from the PR's tree")
    c.add_argument("--json", type=Path, help="write the record here (for compare)")
    h = sub.add_parser("hashes", help="the sha256 of every compiled extension of a build")
    h.add_argument("build", help="a wheel, a site (or vllm folder), or a Python")
    h.add_argument("--json", type=Path, required=True)
    k = sub.add_parser("compare", help="two builds' records against what changed: PASS or FAIL")
    k.add_argument("--base", type=Path, required=True)
    k.add_argument("--pr", type=Path, required=True)
    k.add_argument("--changes", type=Path, required=True, help="moegate builds changes --json's record")
    k.add_argument("--json", type=Path, help="write the verdict and both records here")
    k.add_argument("--md", type=Path, help="write the report's page here (the verdict, every extension, what changed)")
    n = sub.add_parser("pin", help="the merge base's published precompiled wheel")
    n.add_argument("--vllm-src", required=True, type=Path)
    n.add_argument("--commit", required=True)
    n.add_argument("--variant", required=True, help="the wheel index's variant folder: cu130, cu129")
    n.add_argument(
        "--index",
        default=os.environ.get("MOEGATE_PRECOMPILED_INDEX", INDEX),
        help=f"the wheel index (default: $MOEGATE_PRECOMPILED_INDEX, else {INDEX}; a mirror, file:// too)",
    )
    n.add_argument("--arch", help="the platform tag's machine (default: this one's)")
    n.add_argument("--env", type=Path, help="append the VAR=value lines here too ($GITHUB_ENV)")
    n.add_argument("--search", type=int, default=0, help="first-parent commits to look back for a published wheel")
    r = sub.add_parser("rebuild-moe", help="build the MoE extension from a tree, and put it into a build")
    r.add_argument("--vllm-src", required=True, type=Path)
    r.add_argument("--arch", required=True, help="CUDA architectures, TORCH_CUDA_ARCH_LIST's form: 8.9 or '8.9;9.0'")
    r.add_argument("--build-dir", required=True, type=Path, help="kept for the next build (the cached one)")
    r.add_argument("--python", default=sys.executable, help="the Python whose torch it compiles against")
    r.add_argument("--cutlass", type=Path, help="a CUTLASS tree (default: $VLLM_CUTLASS_SRC_DIR)")
    r.add_argument("--launcher", help="a compiler cache: ccache or sccache")
    r.add_argument("--jobs", type=int)
    r.add_argument("--cmake", default="cmake")
    r.add_argument("--cmake-arg", action="append", default=[], help="one more argument for CMake's configure")
    r.add_argument("--configure-only", action="store_true")
    r.add_argument("--into", type=Path, help="a site, a vllm folder or a wheel whose MoE extension it replaces")
    r.add_argument("--out", type=Path, help="with a wheel: the folder the new wheel is written to")
    r.add_argument("--json", type=Path, help="what was built, its sha256 and times")
    return p


def _changes(opts: argparse.Namespace) -> int:
    ch = compiled_changes(opts.vllm_src, opts.base, opts.head)
    print(f"compiled changes {ch.base[:12]}...{ch.head[:12]}: {len(ch.changed)} files changed")
    for c in ch.moe:
        print(f"  MoE  {c.path}: {c.why} [{', '.join(c.targets)}]")
    for path in ch.other:
        print(f"  other compiled  {path}: the fused-MoE ops do not compile from it")
    if opts.json:
        _write_json(opts.json, {**ch.to_json(), "rebuilt": opts.rebuilt})
    unbuilt = ch.unbuilt(opts.rebuilt)
    if unbuilt:
        print(cannot_build_line(unbuilt), file=sys.stderr)
        return 1
    if ch.moe:
        print(
            f"compiled MoE sources changed ({len(ch.moe)} files): rebuilt from the PR's tree ({', '.join(opts.rebuilt)})"
        )
    elif ch.compiled:
        print("no compiled source of the fused-MoE ops changed")
    else:
        print("no compiled source changed")
    return 0


def _compare(opts: argparse.Namespace) -> int:
    base, pr = _read_json(opts.base, "base build's record"), _read_json(opts.pr, "PR build's record")
    for path, rec in ((opts.base, base), (opts.pr, pr)):
        if not isinstance(rec.get("extensions"), dict):
            raise ChangesError(f"{path}: not a build's record (no extensions)")
    changes = CompiledChanges.from_json(_read_json(opts.changes, "compiled-changes record"))
    verdict = compare(base, pr, changes)
    for name, rec in (("base", base), ("PR", pr)):
        print(f"{name} build {rec.get('build')}: {len(rec['extensions'])} extensions")
        for key, digest in sorted(rec["extensions"].items()):
            print(f"  {digest}  {key}")
    print(verdict.line())
    if opts.json:
        _write_json(opts.json, {"verdict": verdict.line(), "ok": verdict.ok, "base": base, "pr": pr,
                                "changes": changes.to_json()})  # fmt: skip
    if opts.md:
        atomic_write(opts.md, page(verdict.line(), base, pr, changes))
    return 0 if verdict.ok else 1


def _pin(opts: argparse.Namespace) -> int:
    try:
        got = pin(opts.vllm_src, opts.commit, opts.variant, index=opts.index, arch=opts.arch, search=opts.search)
    except PinError as exc:
        print(f"precompiled build cannot be pinned: {exc}", file=sys.stderr)
        return 1
    lines = [f"{k}={v}" for k, v in got.env().items()]
    print("\n".join(lines))
    if got.distance:
        print(f"the merge base {got.merge_base} has no published wheel yet; {got.commit}, {got.distance} commits"
              " older, has one, built from the same compiled sources", file=sys.stderr)  # fmt: skip
    if opts.env:
        with opts.env.open("a") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


def _rebuild(opts: argparse.Namespace) -> int:
    try:
        built = build_moe(
            opts.vllm_src, opts.build_dir, arch=opts.arch, python=opts.python, cutlass=opts.cutlass,
            launcher=opts.launcher, jobs=opts.jobs, cmake=opts.cmake, cmake_args=opts.cmake_arg,
            configure_only=opts.configure_only,
        )  # fmt: skip
        placed = (
            [] if opts.configure_only or not opts.into else [install(b.library, opts.into, opts.out) for b in built]
        )
    except MakeError as exc:
        print(f"moegate builds rebuild-moe: {exc}", file=sys.stderr)
        return 1
    rows = []
    for b in built:
        digest = "" if opts.configure_only else sha256_file(b.library)
        rows.append({"target": b.target, "library": str(b.library), "configure_s": round(b.configure_s, 1),
                     "build_s": round(b.build_s, 1), "sha256": digest})  # fmt: skip
        print(f"{b.target}: configure {b.configure_s:.1f} s, build {b.build_s:.1f} s -> {b.library}")
    for p in placed:
        print(f"installed into {p}")
    if opts.json:
        _write_json(opts.json, {"arch": opts.arch, "built": rows, "installed": [str(p) for p in placed]})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    opts = parser().parse_args(argv)
    run = {"changes": _changes, "compare": _compare, "pin": _pin, "rebuild-moe": _rebuild}
    try:
        if opts.command == "hashes":
            rec = record(opts.build)
            _write_json(opts.json, rec)
            print(f"{rec['build']}: {len(rec['extensions'])} extensions -> {opts.json}")
            return 0
        return run[opts.command](opts)
    except (ChangesError, BuildError) as exc:
        print(f"moegate builds {opts.command}: {exc}", file=sys.stderr)
        return 2
