"""vLLM is imported by three rooms only: ``moegate/dispatch/``, ``moegate/builds/`` and ``moegate/offload/``. Checked by
walking the source, not asserted.

Every ``.py`` file under ``moegate/``, ``strategies/``, ``tests/``, ``bench/``,
``tooling/`` and ``lab/`` (and ``noxfile.py``) is parsed with ``ast``; an ``import vllm...`` or
``from vllm... import`` anywhere in it (inside functions too), or an
``importlib.import_module``/``__import__`` of a literal ``vllm...`` name, is a
violation unless the file is inside one of ``VLLM_ROOMS`` or listed in ``ALLOWED``
with its reason; each of those rooms must still import vLLM somewhere (a room that stopped leaves the list). Text that merely names vLLM's modules (the power harness's
targets, a script handed to another interpreter) is not an import.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from tests.support import ROOT

ROOTS = ("moegate", "strategies", "tests", "bench", "tooling", "lab")
FILES = ("noxfile.py",)
VLLM_ROOMS: dict[str, str] = {
    "moegate/dispatch": "observing vLLM's dispatch: the adapter, the recorders, UVA, the offline engine",
    "moegate/builds": "builds as interpreters: does vLLM import in one, its version, vllm bench serve inside one",
    "moegate/offload": "offload truth: where vLLM's offloader put each weight, asked of the loaded model",
}
"""The rooms that may import vLLM (tests/unit/test_layers.py places them), each with what it needs vLLM for."""

# file (relative to the repository root) -> why it may import vLLM itself
ALLOWED: dict[str, str] = {
    "tests/support/diff_standin.py": (
        "the differential tier's CPU stand-in worker imports the stand-in 'vllm' package its test build's site"
        " holds (a fused_experts at vLLM's module name), never the real vLLM"
    ),
    "tests/unit/ab/test_report.py": (
        "two tests import vllm only to skip where it is importable: they show the one-line error of the"
        " benchmark runner where vLLM is missing"
    ),
}


def _is_vllm(module: str | None) -> bool:
    return module is not None and (module == "vllm" or module.startswith("vllm."))


def vllm_imports(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """Each import of vLLM in ``source``: (line, what was imported)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if _is_vllm(a.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and _is_vllm(node.module):
                found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Call) and node.args:
            func, arg = node.func, node.args[0]
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            literal = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
            if name in ("import_module", "__import__") and _is_vllm(literal):
                found.append((node.lineno, f"{name}({literal!r})"))
    return sorted(found)


def violations(root: Path) -> dict[str, list[tuple[int, str]]]:
    """Files under ``root`` outside ``VLLM_ROOMS`` that import vLLM, listed or not."""
    paths = [p for d in ROOTS if (root / d).is_dir() for p in (root / d).rglob("*.py")]
    paths += [root / f for f in FILES if (root / f).is_file()]
    out = {}
    for path in sorted(paths):
        rel = path.relative_to(root)
        if any(rel.is_relative_to(room) for room in VLLM_ROOMS):
            continue
        found = vllm_imports(path.read_text(encoding="utf-8"), str(rel))
        if found:
            out[rel.as_posix()] = found
    return out


def importing_rooms(root: Path) -> set[str]:
    """The rooms of ``VLLM_ROOMS`` that import vLLM in at least one file."""
    return {
        room
        for room in VLLM_ROOMS
        if any(vllm_imports(p.read_text(encoding="utf-8"), str(p)) for p in (root / room).rglob("*.py"))
    }


def test_only_the_dispatch_builds_and_offload_rooms_import_vllm():
    found = violations(ROOT)
    unexpected = {f: hits for f, hits in found.items() if f not in ALLOWED}
    assert not unexpected, (
        f"vLLM is imported outside {', '.join(VLLM_ROOMS)} (take what is needed through one of them, "
        f"or list the file in ALLOWED with its reason): {unexpected}"
    )


def test_every_room_named_as_a_vllm_importer_still_imports_it():
    assert importing_rooms(ROOT) == set(VLLM_ROOMS), "a room of VLLM_ROOMS imports no vLLM any more: drop it"


def test_every_listed_exception_is_still_needed():
    found = violations(ROOT)
    stale = sorted(f for f in ALLOWED if f not in found)
    assert not stale, f"ALLOWED lists files that no longer import vLLM; drop them: {stale}"


def test_the_names_module_imports_nothing():
    tree = ast.parse((ROOT / "moegate" / "dispatch" / "names.py").read_text(encoding="utf-8"))
    imports = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert imports == [], f"moegate/dispatch/names.py must stay a leaf: {imports}"


def test_a_planted_import_is_caught(tmp_path):
    for room in VLLM_ROOMS:
        (tmp_path / room).mkdir(parents=True)
        (tmp_path / room / "fine.py").write_text("import vllm\n")  # the allowed places
    (tmp_path / "lab").mkdir()
    (tmp_path / "moegate" / "clean.py").write_text(
        textwrap.dedent(
            """\
            from moegate.dispatch import names
            from . import vllm
            MODULE = "vllm.model_executor.layers.fused_moe.fused_moe"
            SCRIPT = "import vllm; print(vllm.__version__)"
            """
        )
    )
    (tmp_path / "moegate" / "planted.py").write_text(
        textwrap.dedent(
            """\
            import os, vllm.platforms as p

            def late():
                from vllm.model_executor.layers.fused_moe import fused_moe
                return fused_moe
            """
        )
    )
    (tmp_path / "lab" / "probe.py").write_text("import importlib\nm = importlib.import_module('vllm.utils')\n")
    assert violations(tmp_path) == {
        "moegate/planted.py": [
            (1, "import vllm.platforms"),
            (4, "from vllm.model_executor.layers.fused_moe import ..."),
        ],
        "lab/probe.py": [(2, "import_module('vllm.utils')")],
    }
    assert importing_rooms(tmp_path) == set(VLLM_ROOMS)
    (tmp_path / "moegate" / "offload" / "fine.py").write_text("import os\n")
    assert importing_rooms(tmp_path) == {"moegate/dispatch", "moegate/builds"}
