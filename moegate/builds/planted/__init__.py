"""Builds as interpreters: a venv that sees a Python's packages plus unpacked sites, optionally with a planted bug.

    python -m moegate.builds.planted DEST --python PY [--site DIR]... [--bug SPEC] [--version V]

makes ``DEST`` a venv (``PY -m venv --without-pip``) whose interpreter ``DEST/bin/python`` is a
build the e2e and A/B tiers take as ``--base``/``--pr``: no search-path variable anywhere. A venv made
from a venv's Python is based on the *base* interpreter, so ``PY``'s own ``sys.path`` entries (its
site-packages, with their ``.pth`` files: editable installs keep working) come back through a ``.pth``
line in the new venv's site-packages, and each ``--site`` directory (a vLLM bundle unpacked on the
GPU machine, lm-eval's wheelhouse) goes first on the path, before the standard library, as an
entry of the search-path variable would.

``--bug`` copies ``plant.py`` (self-contained) into the venv's site-packages as
``moegate_planted.py``, its config beside it as ``moegate_planted.json`` (not an environment
variable: the bug belongs to the build), and a ``.pth`` line that imports it at every start:

- ``scale=F``: the Qwen3-MoE block's output times ``F`` on every path (``F > 0``, not 1);
- ``expert=SRC:DST``: host-resident expert weights on the sorted path: expert ``SRC``'s blocks
  read expert ``DST``'s weights;
- ``renorm=off``: the router's top-k weights are not renormalised;
- ``weights=F``: the router's top-k weights times ``F`` (the experts' float32 sum ``F`` too large
  before its rounding: a systematic output error that bfloat16 rounding does not swallow);
- ``uva=noop``: the UVA offloader offloads and marks nothing; ``uva=back``: after post-processing,
  marked weights are copied back to the device and stay marked (``moegate.offload.verdict`` must
  fail both);
- ``naive-scale=F``: the Qwen3-MoE block's output times ``F`` only on calls with
  ``tokens * top_k * 4 <= experts`` (small-batch decode), every placement (reachable on a CPU);
- ``naive-host-top1=F``: the top-1 router weight times ``F`` in the fused-MoE experts on calls in that
  region whose expert weights are host-resident (UVA): where the change under test acts (a GPU);
- ``naive-top1=F``: the same on every placement (inside vLLM's fused-MoE op: graphs and compile see it);
- ``swap-top1=LO-HI``: on router-gate calls of ``LO`` to ``HI`` tokens (``swap-top1=2-4``: decode steps of 2-4
  sequences), the first two tokens exchange their top-1 experts, every placement and device: a bug of the batch's
  composition (a batch of one never shows it);
- ``reround=K`` (harmless): the Qwen3-MoE block's output times ``K`` and divided by ``K`` again in the
  model's dtype: the same mathematics, two more roundings (a power of two: bit-identical);
- ``reround-attn=K`` (harmless): the same on the attention block's output;
- ``dispatch=ignore-host``: the choice between the naive and the sorted path no longer asks whether the expert
  weights are host-resident (vLLM's ``_weights_host_resident`` answers False at both entrypoints), as 0.32.0 chose:
  a planted dispatch bug, which the dispatch tier sees on a CPU;
- ``workspace=G``: the fused-MoE experts allocate ``G`` GiB of workspace on every call: more than the GPU has, the
  build's own out-of-memory error (``lab/gpu/faults.sh``).
- inside the fused-MoE experts, for the differential kernel tier (``plant_experts.py``, copied beside the plant):
  ``moe-reround=K`` (one more rounding of every output element: a loss of accuracy the tier must catch; a power of
  two is bit-identical), and the harmless ``topk-order=reverse`` (each token's experts summed in another order) and
  ``act-fp32=silu`` (silu-and-mul redone in float32, one rounding).

A build with a bug compiles into a cache of its own (``VLLM_CACHE_ROOT`` is ``DEST/vllm-cache`` unless set): vLLM
keys its ``torch.compile`` cache by config and source files, so a bug's build sharing the default cache can load
another build's compiled graph, and a bug planted at startup in traced code is then not served.

``--version V`` relabels the build: its vLLM reports release ``V`` (``vllm.__version__``, the server's
``/version``), as a dev build of a pull request does (``0.33.1.dev1+g1111111``): the goldens of its key do
not exist; nothing else changes.

A bad spec, a missing ``PY`` or a ``DEST`` that is something other than such a build: one line,
exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RECORD = "moegate-build.json"
PATHS_MODULE = "_moegate_build_paths"  # its .pth sorts before the plant's
PLANT_MODULE = "moegate_planted"
PLANT_SOURCE = Path(__file__).with_name("plant.py")
PLANT_EXPERTS = "moegate_planted_experts"  # plant.py imports it, so it is copied beside it
PLANT_EXPERTS_SOURCE = Path(__file__).with_name("plant_experts.py")
_SEARCH_PATH_VARIABLES = ("PYTHON" + "PATH", "PYTHON" + "HOME")  # spelled so the tree stays free of the name
_PROBE = "import json, sys, sysconfig; print(json.dumps([sys.path, sysconfig.get_path('purelib')]))"


FACTOR_KINDS = ("naive-scale", "naive-top1", "naive-host-top1", "reround", "reround-attn", "moe-reround")
"""Kinds whose value is one factor, kept in the config as ``factor``."""
KINDS = (
    "scale=F, weights=F, expert=SRC:DST, renorm=off, uva=noop|back, naive-scale=F, naive-top1=F, naive-host-top1=F,"
    " swap-top1=LO-HI, reround=K, reround-attn=K, workspace=G, moe-reround=K, topk-order=reverse, act-fp32=silu"
    " or dispatch=ignore-host"
)
FIXED_KINDS = {"topk-order": "reverse", "act-fp32": "silu", "dispatch": "ignore-host"}
"""Kinds with one value each (the experts' harmless re-implementations)."""
HARMLESS = ("reround", "reround-attn", "topk-order", "act-fp32")
"""Kinds that change roundings only, not the mathematics: a harmless change, for the ``equivalent`` promise."""


class BuildError(ValueError):
    """A build that cannot be made as asked; the message is one line."""


def parse_bug(spec: str) -> dict[str, Any]:
    """The plant's config for ``spec`` (see the module docstring), or ``BuildError``."""
    kind, sep, value = spec.partition("=")
    kind, value = kind.strip(), value.strip()
    if not sep:
        raise BuildError(f"--bug {spec!r}: expected KIND=VALUE ({KINDS})")
    if kind in FACTOR_KINDS:
        try:
            factor = float(value)
        except ValueError:
            raise BuildError(f"--bug {spec!r}: {kind} needs a number, e.g. {kind}=1.01") from None
        if not (factor > 0 and factor != 1.0 and factor != float("inf")):
            raise BuildError(f"--bug {spec!r}: {kind} must be a finite number > 0 other than 1")
        return {"spec": spec, "kind": kind, "factor": factor}
    if kind in ("scale", "weights"):
        try:
            factor = float(value)
        except ValueError:
            raise BuildError(f"--bug {spec!r}: {kind} needs a number, e.g. {kind}=1.005") from None
        if not (factor > 0 and factor != 1.0 and factor != float("inf")):
            raise BuildError(f"--bug {spec!r}: {kind} must be a finite number > 0 other than 1")
        return {"spec": spec, "kind": kind, kind: factor}
    if kind == "workspace":
        try:
            gib = float(value)
        except ValueError:
            raise BuildError(f"--bug {spec!r}: workspace needs the GiB it allocates, e.g. workspace=1024") from None
        if not (0 < gib < float("inf")):
            raise BuildError(f"--bug {spec!r}: workspace must be a finite number of GiB > 0")
        return {"spec": spec, "kind": "workspace", "gib": gib}
    if kind == "expert":
        src, colon, dst = value.partition(":")
        if not (colon and src.isdigit() and dst.isdigit() and int(src) != int(dst)):
            raise BuildError(f"--bug {spec!r}: expert needs two different expert ids SRC:DST, e.g. expert=0:1")
        return {"spec": spec, "kind": "expert", "src": int(src), "dst": int(dst)}
    if kind == "swap-top1":
        lo, dash, hi = value.partition("-")
        if not (dash and lo.isdigit() and hi.isdigit() and 2 <= int(lo) <= int(hi)):
            raise BuildError(
                f"--bug {spec!r}: swap-top1 needs a token range LO-HI with 2 <= LO <= HI, e.g. swap-top1=2-4"
            )
        return {"spec": spec, "kind": "swap-top1", "lo": int(lo), "hi": int(hi)}
    if kind == "uva":
        if value not in ("noop", "back"):
            raise BuildError(f"--bug {spec!r}: the offload bugs are uva=noop and uva=back")
        return {"spec": spec, "kind": "uva", "uva": value}
    if kind in FIXED_KINDS:
        if value != FIXED_KINDS[kind]:
            raise BuildError(f"--bug {spec!r}: {kind} has one form, {kind}={FIXED_KINDS[kind]}")
        return {"spec": spec, "kind": kind, kind: value}
    if kind == "renorm":
        if value != "off":
            raise BuildError(f"--bug {spec!r}: the renormalisation bug is renorm=off")
        return {"spec": spec, "kind": "renorm", "renorm": "off"}
    raise BuildError(f"--bug {spec!r}: unknown kind {kind!r} ({KINDS})")


def _probe(python: str) -> tuple[list[str], str]:
    """``python``'s own ``sys.path`` (without the caller's search-path variables or current directory) and its purelib."""
    env = {k: v for k, v in os.environ.items() if k not in _SEARCH_PATH_VARIABLES}
    proc = subprocess.run([python, "-c", _PROBE], env=env, capture_output=True, text=True, check=False, cwd="/")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BuildError(f"{python}: cannot read its sys.path ({last})")
    path, purelib = json.loads(proc.stdout)
    return [p for p in path if p and p != "/"], purelib


def make_build(
    dest: Path, python: str, *, sites: Sequence[str] = (), bug: str | None = None, version: str | None = None
) -> Path:
    """Make ``dest`` a build (see the module docstring) and return its interpreter, ``dest/bin/python``."""
    dest = Path(dest).absolute()
    config = parse_bug(bug) if bug is not None else None
    if version is not None:
        if not version.strip() or any(c.isspace() for c in version):
            raise BuildError(f"--version {version!r}: a release label without spaces, e.g. 0.33.1.dev1+g1111111")
        config = {**(config or {}), "version": version}
    found = shutil.which(python)
    if found is None:
        raise BuildError(f"--python {python}: no such interpreter")
    site_dirs = [str(Path(s).expanduser().absolute()) for s in sites]
    missing = [s for s in site_dirs if not Path(s).is_dir()]
    if missing:
        raise BuildError(f"--site {missing[0]}: not a directory")
    if dest.exists() and any(dest.iterdir()) and not (dest / RECORD).is_file():
        raise BuildError(f"{dest}: exists and is not a build made here (no {RECORD}); choose another DEST")
    own_path, _ = _probe(found)
    if dest.exists():
        shutil.rmtree(dest)
    try:
        proc = subprocess.run(
            [found, "-m", "venv", "--without-pip", str(dest)], check=False, capture_output=True, text=True
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise BuildError(f"{found} -m venv {dest}: {last}")
        venv_python = dest / "bin" / "python"
        venv_path, purelib = _probe(str(venv_python))
        extra = [p for p in dict.fromkeys(own_path) if p not in venv_path and p not in site_dirs and Path(p).exists()]
        site_packages = Path(purelib)
        # a module, imported once even where site reads this site-packages twice (lib and its lib64 link)
        code = f"import os\nimport site\nimport sys\n\nsys.path[0:0] = {site_dirs!r}\nfor p in {extra!r}:\n    site.addsitedir(p)\n"
        if bug is not None:
            # vLLM keys its torch.compile cache by config and source files, not by a plant made at startup: a bug's
            # build sharing the default cache loaded another build's compiled graph and served without its bug (the
            # H200 panel, 2026-12-02: scale=1.01 changed no log-probability of 64 prompts)
            code += f"os.environ.setdefault('VLLM_CACHE_ROOT', {str(dest / 'vllm-cache')!r})\n"
        (site_packages / f"{PATHS_MODULE}.py").write_text(code, encoding="utf-8")
        (site_packages / f"{PATHS_MODULE}.pth").write_text(f"import {PATHS_MODULE}\n", encoding="utf-8")
        if config is not None:
            shutil.copyfile(PLANT_SOURCE, site_packages / f"{PLANT_MODULE}.py")
            shutil.copyfile(PLANT_EXPERTS_SOURCE, site_packages / f"{PLANT_EXPERTS}.py")
            (site_packages / f"{PLANT_MODULE}.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
            (site_packages / f"{PLANT_MODULE}.pth").write_text(f"import {PLANT_MODULE}\n", encoding="utf-8")
        record = {"python": found, "sites": site_dirs, "paths": extra, "bug": config if bug is not None else None}
        if version is not None:
            record["version"] = version
        (dest / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)  # nothing written half
        raise
    return venv_python


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="moegate make-build", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("dest", type=Path, help="the build's venv directory (made, or remade if it is one)")
    ap.add_argument("--python", required=True, help="the interpreter whose packages the build sees")
    ap.add_argument("--site", action="append", default=[], help="a directory first on the path (repeatable)")
    ap.add_argument("--bug", default=None, help=KINDS)
    ap.add_argument("--version", default=None, help="the vLLM release the build reports (a dev build's label)")
    args = ap.parse_args(argv)
    try:
        python = make_build(args.dest, args.python, sites=args.site, bug=args.bug, version=args.version)
    except BuildError as exc:
        print(f"moegate.builds.planted: {exc}", file=sys.stderr)
        return 2
    print(python)
    return 0
