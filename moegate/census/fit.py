"""Does moegate still fit this vLLM? Asked before any case runs, so upkeep reads apart from a FAIL.

    python -m moegate.census.fit [--json FILE]      # in the vLLM environment's Python

The nightly run against vLLM's main branch (``.github/workflows/vllm-main.yml``) asks this first. A vLLM that
renamed a layer, moved an import or dropped a name moegate drives is not a bug the gate found: the gate's own code
needs upkeep (``moegate/dispatch/names.py``, where every vLLM name moegate relies on is spelled once, and the census).
Each check is one line:

- ``import vllm`` (in this process: a failure is vLLM's own, or its environment's);
- every module ``names`` spells imports (the fused-MoE package and its two entrypoints, its config, the UVA
  offloader, the loader's utilities);
- the names the target drives are there (``names.REQUIRED``), and the offloader's class, the loader's
  ``device_loading_context``, at least one kernel launcher;
- the census reads the package (``moegate.census``): its builder, and the decision's site.

Exit status: 0 it fits, 3 it no longer fits (one line for each thing that moved), 2 bad input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from moegate.census import census
from moegate.census.source import CensusError, locate
from moegate.core.golden_files import atomic_write
from moegate.dispatch import names

NO_FIT = 3
MODULES = (
    names.FUSED_MOE_PKG,
    names.FUSED_MOE,
    names.TRITON_MOE,
    names.FUSED_MOE_CONFIG,
    names.UVA_OFFLOADER_MODULE,
    names.LOADER_UTILS,
)
NAMES = (
    *names.REQUIRED,
    (names.UVA_OFFLOADER_MODULE, names.UVA_OFFLOADER),
    (names.LOADER_UTILS, names.DEVICE_LOADING_CONTEXT),
)


@dataclass
class Fit:
    version: str = "unknown"
    moved: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.moved


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}".rstrip(": ")


def check_imports(fit: Fit) -> dict[str, ModuleType]:
    try:
        vllm = importlib.import_module(names.PACKAGE)
    except Exception as exc:  # noqa: BLE001 - a vLLM's import can fail with anything; it is one line here
        fit.moved.append(f"vLLM does not import here: {_first_line(exc)}")
        return {}
    fit.version = str(getattr(vllm, "__version__", "unknown"))
    modules = {}
    for module in MODULES:
        try:
            modules[module] = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001
            fit.moved.append(f"module {module} does not import ({_first_line(exc)}): moved or gone")
    fit.checked.append(f"{len(modules)} of {len(MODULES)} modules import")
    return modules


def check_names(fit: Fit, modules: dict[str, ModuleType]) -> None:
    present = [(m, n) for m, n in NAMES if m in modules]
    for module, name in present:
        if not hasattr(modules[module], name):
            fit.moved.append(f"{module}.{name} is gone: renamed or moved (moegate/dispatch/names.py spells it)")
    launchers = [n for n in names.LAUNCHERS for m in (names.FUSED_MOE, names.TRITON_MOE)
                 if m in modules and hasattr(modules[m], n)]  # fmt: skip
    if names.FUSED_MOE in modules and not launchers:
        fit.moved.append(f"none of the kernel launchers ({', '.join(names.LAUNCHERS)}) is in the entrypoints")
    fit.checked.append(f"{len(present)} names, {len(set(launchers))} launchers")


def check_census(fit: Fit, take: Callable[[], census.Census] | None = None) -> None:
    """The census reads this vLLM (``take``: the census of it, default taken here) and finds its builder and sites."""
    try:
        records = (take or (lambda: census.take(locate())))().records
    except CensusError as exc:
        fit.moved.append(f"the census cannot read this vLLM: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - a tree the census's parser did not expect
        fit.moved.append(f"the census stopped on this vLLM: {_first_line(exc)}")
        return
    kinds = [r["kind"] for r in records]
    if "builder" not in kinds:
        fit.moved.append("the census finds no fused-MoE layer builder (a renamed layer class?)")
    if not any(r["kind"] == "site" and r.get("rule") == "the decision" for r in records):
        fit.moved.append(f"the census finds no decision site ({names.PREPARE_EXPERT_ASSIGNMENT} calling an aligner)")
    fit.checked.append(f"census: {kinds.count('layer')} layers, {kinds.count('site')} sites")


def probe(take: Callable[[], census.Census] | None = None) -> Fit:
    """Whether moegate fits the installed vLLM; ``take`` gives its census where the caller holds one already."""
    fit = Fit()
    modules = check_imports(fit)
    if modules:
        check_names(fit, modules)
        check_census(fit, take)
    return fit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moegate.census.fit", description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the result here as JSON (fits, version, moved, checked)")
    args = ap.parse_args(argv)
    fit = probe()
    if fit.fits:
        print(f"moegate fits vLLM {fit.version}: {'; '.join(fit.checked)}")
    else:
        print(f"moegate no longer fits vLLM {fit.version}:")
        for line in fit.moved:
            print(f"  {line}")
    if args.json:
        record = {"fits": fit.fits, "version": fit.version, "moved": fit.moved, "checked": fit.checked}
        atomic_write(args.json, json.dumps(record))
    return 0 if fit.fits else NO_FIT


if __name__ == "__main__":
    sys.exit(main())
