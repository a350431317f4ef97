"""Every pointer in the prose still points somewhere: modules, ``python -m`` commands, files and links.

``README.md``, ``docs/*.md``, ``results/*.md`` and ``tools/``'s how-tos name the project's modules (``moegate.core.spec``,
``moegate.core.profiles.KERNEL_EXAMPLES``), its command lines (``python -m tooling.ci.gate_plan``), its files
(``tools/gpu/e2e_plan.sh``) and link pages and figures (``[...](results/ci-time.md)``). After a move they rot
quietly; here each is resolved by path, without importing anything:

- a dotted name of the project (``moegate.``, ``tooling.``, ``tools.``, ``tests.``, ``bench.``) is its longest
  prefix that is a module file, and the next name, if any, is defined at that module's top;
- a path under a tracked top-level folder, or a Markdown link that is not a URL, is a file or folder of the
  checkout (a link relative to the page's folder); ``<placeholders>``, globs and ``$VARIABLES`` are left alone;
- a path that is gone on purpose says so: the page names its last version as ``git show COMMIT:PATH``, and that
  commit has it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import tomllib
from functools import cache
from pathlib import Path

from tests.support import ROOT

PAGES = ("README.md", "docs/*.md", "results/*.md", "tools/**/*.md")
"""The pages read: the README, the docs, the results and the GPU machine's how-tos."""
PACKAGES = ("moegate", "tooling", "tools", "tests", "bench")
FOLDERS: tuple[str, ...] = ("moegate", "strategies", "tests", "tools", "tooling", "bench", "docs", "results", "golden")
FOLDERS += ("models", "power", "examples", ".github", ".ci")
"""The tracked top-level folders a path may start with."""
FILE_ENDINGS = frozenset({"yml", "yaml", "md", "json", "jsonl", "py", "toml", "txt", "tsv", "log", "xml", "png", "sh"})
"""A dotted name ending so is a file name (``moegate.yml``), not a module."""

DOTTED = re.compile(r"(?<![\w/.-])(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w/.:-])(?:" + "|".join(re.escape(f) for f in FOLDERS) + r")/[\w./@+<>*{}$…-]*")
LINK = re.compile(r"\]\(([^)\s]+)\)")
RETIRED = re.compile(r"git show ([0-9a-f]{7,40}):([\w./-]+)")
SKIP = re.compile(r"[<>*{}$…]|\.\.\.")
ELSEWHERE = re.compile(r"vLLM's `?$")
"""A path right after "vLLM's" is one of vLLM's tree (``tests/models/utils.py``), not of this one."""


@cache
def _package_dirs(root: Path) -> dict[str, Path]:
    setuptools = tomllib.loads((root / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {})
    return {name: root / folder for name, folder in setuptools.get("package-dir", {}).items()}


def _module_file(root: Path, dotted: str) -> Path | None:
    mapped = _package_dirs(root)
    for name, folder in mapped.items():
        if dotted == name or dotted.startswith(name + "."):
            base, rest = folder, dotted[len(name) :].lstrip(".").split(".") if dotted != name else []
            break
    else:
        base, rest = root, dotted.split(".")
    path = base.joinpath(*rest) if rest else base
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return path if path.is_dir() and rest else None  # a namespace folder (tools/gpu)


@cache
def _names(path: Path) -> frozenset[str]:
    """Names bound at a module's top (definitions, assignments, imports)."""
    if path.is_dir():
        return frozenset(p.stem for p in path.iterdir())
    names: set[str] = {p.stem for p in path.parent.iterdir()} if path.name == "__init__.py" else set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def dotted_problem(root: Path, dotted: str) -> str | None:
    """Why ``dotted`` does not resolve, or None."""
    if dotted.rsplit(".", 1)[-1] in FILE_ENDINGS:
        return None
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        found = _module_file(root, ".".join(parts[:i]))
        if found is None:
            continue
        if i == len(parts) or parts[i] in _names(found):
            return None
        return f"{'.'.join(parts[:i])} has no {parts[i]!r}"
    return "no such module"


def _retired(root: Path, text: str) -> set[str]:
    """Paths the page says are gone, whose named commit has them."""
    out = set()
    for commit, path in RETIRED.findall(text):
        done = subprocess.run(
            ["git", "-C", str(root), "cat-file", "-e", f"{commit}:{path}"], check=False, capture_output=True
        )
        if done.returncode == 0:
            out.add(path)
    return out


def _ignored(root: Path, path: Path) -> bool:
    """A file git ignores is one a run writes (``golden/<name>.obtained``, ``reports/``), not one it keeps."""
    done = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", str(path)], check=False, capture_output=True)
    return done.returncode == 0


def page_problems(root: Path, page: Path) -> list[str]:
    """``page:line: pointer: why`` for every pointer of ``page`` that does not resolve."""
    text = page.read_text(encoding="utf-8")
    retired = _retired(root, text)
    rel = page.relative_to(root).as_posix()
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in DOTTED.finditer(line):
            why = dotted_problem(root, m.group(0).rstrip("."))
            if why:
                found.append(f"{rel}:{n}: {m.group(0)}: {why}")
        targets = [(m.group(0), root) for m in PATH.finditer(line) if not ELSEWHERE.search(line[: m.start()])]
        targets += [(m.group(1), page.parent) for m in LINK.finditer(line) if not re.match(r"[a-z]+:", m.group(1))]
        for target, base in targets:
            path = target.split("#", 1)[0].rstrip(".,:;")
            if not path or SKIP.search(path) or path in retired:
                continue
            if not (base / path).exists() and not _ignored(root, base / path):
                found.append(f"{rel}:{n}: {path}: no such file or folder")
    return found


def problems(root: Path, pages: tuple[str, ...] = PAGES) -> list[str]:
    return [p for pattern in pages for page in sorted(root.glob(pattern)) for p in page_problems(root, page)]


def test_every_pointer_in_the_readme_docs_and_results_resolves():
    found = problems(ROOT)
    assert not found, "pointers that lead nowhere (move them with the code):\n" + "\n".join(found)


def test_every_link_of_the_readme_is_a_file_of_the_checkout():
    text = (ROOT / "README.md").read_text()
    links = [t.split("#")[0] for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert links, "the README links no page or figure"
    assert [t for t in links if not (ROOT / t).is_file()] == []


def test_a_stale_module_a_missing_name_a_moved_file_and_a_dead_link_are_each_named(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.setuptools]\npackage-dir = { "moegate.strategies" = "strategies" }\n'
    )
    for rel, text in {
        "moegate/__init__.py": "",
        "moegate/core/__init__.py": "",
        "moegate/core/profiles.py": "KERNEL_EXAMPLES = 3\n",
        "strategies/__init__.py": "from moegate.strategies.moe import moe_cases\n",
        "strategies/moe.py": "def moe_cases(): ...\n",
        "results/ci-time.md": "",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    page = tmp_path / "results" / "page.md"
    page.write_text(
        "`moegate.core.profiles.KERNEL_EXAMPLES`, `moegate.strategies.moe_cases`, `python -m moegate.core`,\n"
        "`.github/workflows/moegate.yml` is a file name; [time](ci-time.md), `golden/<name>.obtained`\n"
        "`moegate.profiles.KERNEL_EXAMPLES` and `moegate.kernel_workers.auto_workers`\n"
        "`moegate.core.profiles.EXAMPLES`, `tools/probes/tf32_operands.py`, [gone](../docs/none.md#a)\n"
        "vLLM's `tests/models/utils.py`; `bench/old.py`, its last version `git show 0000000:bench/old.py`\n"
    )
    assert problems(tmp_path, ("results/*.md",)) == [
        "results/page.md:2: .github/workflows/moegate.yml: no such file or folder",
        "results/page.md:3: moegate.profiles.KERNEL_EXAMPLES: moegate has no 'profiles'",
        "results/page.md:3: moegate.kernel_workers.auto_workers: moegate has no 'kernel_workers'",
        "results/page.md:4: moegate.core.profiles.EXAMPLES: moegate.core.profiles has no 'EXAMPLES'",
        "results/page.md:4: tools/probes/tf32_operands.py: no such file or folder",
        "results/page.md:4: ../docs/none.md: no such file or folder",
        "results/page.md:5: bench/old.py: no such file or folder",  # the named commit does not have it
    ]
