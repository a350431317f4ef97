"""Every pointer in the prose still points somewhere: modules, ``python -m`` commands, files and links.

The pages (``README.md``, ``docs/**/*.md``, ``results/*.md``, the how-tos under ``lab/`` and ``tooling/``) and every
docstring of the code (``moegate/``, ``strategies/``, ``tooling/``, ``lab/``, ``bench/``, ``tests/``) name the
project's modules (``moegate.core.spec``, ``moegate.core.profiles.KERNEL_EXAMPLES``), its command lines
(``python -m tooling.ci.gate_plan``), its files (``lab/gpu/e2e_plan.sh``) and link pages and figures
(``[...](results/ci-time.md)``). After a move they rot quietly; here each is resolved by path, without importing
anything:

- a dotted name of the project (``moegate.``, ``tooling.``, ``tools.``, ``tests.``, ``bench.``) is its longest
  prefix that is a module file, and the next name, if any, is defined at that module's top;
- a path under a tracked top-level folder, or a Markdown link that is not a URL, is a file or folder of the
  checkout (a link relative to the page's folder); ``<placeholders>``, globs and ``$VARIABLES`` are left alone;
- a path that is gone on purpose says so: the text names it as ``git show COMMIT:PATH``, and that commit has it (or,
  where the last name is a placeholder such as ``NAME``, has its folder). Named so, it is not a path of the tree
  anywhere in that text, nor is a folder above it (``git show dae633c:results/raw/NAME`` retires ``results/raw/``).
"""

from __future__ import annotations

import ast
import re
import subprocess
import tomllib
from functools import cache
from pathlib import Path

from tests.support import ROOT

PAGES = ("README.md", "docs/**/*.md", "results/*.md", "lab/**/*.md", "tooling/**/*.md")
"""The pages read: the README, the docs (the design pages too), the results and the how-tos."""
SOURCES = ("moegate", "strategies", "tooling", "lab", "bench", "tests")
"""The code whose docstrings are read: every module's, class's and function's."""
PACKAGES = ("moegate", "tooling", "lab", "tests", "bench")
FOLDERS: tuple[str, ...] = ("moegate", "strategies", "tests", "lab", "tooling", "bench", "docs", "results", "golden")
FOLDERS += ("models", "power", "examples", ".github", ".ci")
"""The tracked top-level folders a path may start with."""
FILE_ENDINGS = frozenset({"yml", "yaml", "md", "json", "jsonl", "py", "toml", "txt", "tsv", "log", "xml", "png", "sh"})
"""A dotted name ending so is a file name (``moegate.yml``), not a module."""

DOTTED = re.compile(r"(?<![\w/.-])(?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w/.:-])(?:" + "|".join(re.escape(f) for f in FOLDERS) + r")/[\w./@+<>*{}$…-]*")
LINK = re.compile(r"\]\(([^)\s]+)\)")
RETIRED = re.compile(r"git show ([0-9a-f]{7,40}):([\w./-]+)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")
"""A last name that stands for any (``results/raw/NAME``)."""
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
    return path if path.is_dir() and rest else None  # a namespace folder (lab/gpu)


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
    """Paths the text says are gone, whose named commit has them, and the folders above them."""
    out = set()
    for commit, path in RETIRED.findall(text):
        path = path.rstrip(".,:;")
        folder, _, last = path.rstrip("/").rpartition("/")
        held = folder if PLACEHOLDER.match(last) and folder else path
        done = subprocess.run(
            ["git", "-C", str(root), "cat-file", "-e", f"{commit}:{held}"], check=False, capture_output=True
        )
        if done.returncode == 0:
            parts = path.rstrip("/").split("/")
            out |= {path, *("/".join(parts[:i]) + "/" for i in range(1, len(parts)))}
    return out


def _ignored(root: Path, path: Path) -> bool:
    """A file git ignores is one a run writes (``golden/<name>.obtained``, ``reports/``), not one it keeps."""
    done = subprocess.run(["git", "-C", str(root), "check-ignore", "-q", str(path)], check=False, capture_output=True)
    return done.returncode == 0


def text_problems(root: Path, rel: str, base: Path, lines: list[tuple[int, str]], retired: set[str]) -> list[str]:
    """``rel:line: pointer: why`` for every pointer of ``lines`` (numbered) that does not resolve; links are relative
    to ``base``."""
    found = []
    for n, line in lines:
        for m in DOTTED.finditer(line):
            why = dotted_problem(root, m.group(0).rstrip("."))
            if why:
                found.append(f"{rel}:{n}: {m.group(0)}: {why}")
        targets = [(m.group(0), root) for m in PATH.finditer(line) if not ELSEWHERE.search(line[: m.start()])]
        targets += [(m.group(1), base) for m in LINK.finditer(line) if not re.match(r"[a-z]+:", m.group(1))]
        for target, folder in targets:
            path = target.split("#", 1)[0].rstrip(".,:;")
            if not path or SKIP.search(path) or path in retired:
                continue
            if not (folder / path).exists() and not _ignored(root, folder / path):
                found.append(f"{rel}:{n}: {path}: no such file or folder")
    return list(dict.fromkeys(found))  # a link that is also a path is one finding


def page_problems(root: Path, page: Path) -> list[str]:
    """Every pointer of a page that does not resolve."""
    text = page.read_text(encoding="utf-8")
    lines = list(enumerate(text.splitlines(), 1))
    return text_problems(root, page.relative_to(root).as_posix(), page.parent, lines, _retired(root, text))


def docstrings(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every docstring of a module: its own, its classes' and its functions'."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text is not None:
                out.append((node.body[0].lineno, text))
    return out


def source_problems(root: Path, path: Path) -> list[str]:
    """Every pointer of a source file's docstrings that does not resolve (each docstring read alone; a link in one is
    relative to the checkout, as its paths are)."""
    rel = path.relative_to(root).as_posix()
    found = []
    for first, text in docstrings(path.read_text(encoding="utf-8")):
        lines = list(enumerate(text.splitlines(), first))
        found += text_problems(root, rel, root, lines, _retired(root, text))
    return found


def problems(root: Path, pages: tuple[str, ...] = PAGES, sources: tuple[str, ...] = ()) -> list[str]:
    found = [p for pattern in pages for page in sorted(root.glob(pattern)) for p in page_problems(root, page)]
    files = sorted(f for folder in sources for f in (root / folder).rglob("*.py") if ".nox" not in f.parts)
    return found + [p for f in files for p in source_problems(root, f)]


def test_every_pointer_in_the_readme_docs_and_results_resolves():
    found = problems(ROOT)
    assert not found, "pointers that lead nowhere (move them with the code):\n" + "\n".join(found)


def test_every_path_and_module_a_docstring_names_exists():
    found = problems(ROOT, pages=(), sources=SOURCES)
    assert not found, "docstrings that point nowhere (move them with the code):\n" + "\n".join(found)


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
        "`moegate.core.profiles.EXAMPLES`, `lab/probes/tf32_operands.py`, [gone](../docs/none.md#a)\n"
        "vLLM's `tests/models/utils.py`; `bench/old.py`, its last version `git show 0000000:bench/old.py`\n"
    )
    assert problems(tmp_path, ("results/*.md",)) == [
        "results/page.md:2: .github/workflows/moegate.yml: no such file or folder",
        "results/page.md:3: moegate.profiles.KERNEL_EXAMPLES: moegate has no 'profiles'",
        "results/page.md:3: moegate.kernel_workers.auto_workers: moegate has no 'kernel_workers'",
        "results/page.md:4: moegate.core.profiles.EXAMPLES: moegate.core.profiles has no 'EXAMPLES'",
        "results/page.md:4: lab/probes/tf32_operands.py: no such file or folder",
        "results/page.md:4: ../docs/none.md: no such file or folder",
        "results/page.md:5: bench/old.py: no such file or folder",  # the named commit does not have it
    ]


def _git(root: Path, *args: str) -> str:
    cmd = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def test_a_path_named_by_its_commit_is_no_tree_path_there_nor_its_folders(tmp_path):
    """``git show COMMIT:results/raw/NAME`` (NAME any archive) retires that path and the folders above it on that
    page, when the commit has the folder; a commit without it retires nothing."""
    _git(tmp_path, "init", "--quiet")
    (tmp_path / "results" / "raw").mkdir(parents=True)
    (tmp_path / "results" / "raw" / "run.tar.xz").write_bytes(b"x")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "--quiet", "-m", "archives")
    held = _git(tmp_path, "rev-parse", "HEAD")
    _git(tmp_path, "rm", "--quiet", "-r", "results/raw")
    _git(tmp_path, "commit", "--quiet", "-m", "the archives leave")
    page = tmp_path / "results" / "page.md"
    page.parent.mkdir(exist_ok=True)
    text = "kept in `results/raw/` until {c}; it holds each at `results/raw/NAME`: `git show {c}:results/raw/NAME`\n"
    page.write_text(text.format(c=held[:7]))
    assert problems(tmp_path, ("results/*.md",)) == []
    page.write_text(text.format(c=_git(tmp_path, "rev-parse", "--short", "HEAD")))
    assert problems(tmp_path, ("results/*.md",)) == [
        "results/page.md:1: results/raw/: no such file or folder",
        "results/page.md:1: results/raw/NAME: no such file or folder",
    ]


def test_a_docstring_of_a_module_class_or_function_is_read_with_its_own_line_numbers(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "moegate").mkdir()
    (tmp_path / "moegate" / "__init__.py").write_text("")
    (tmp_path / "moegate" / "mod.py").write_text(
        '"""Runs on the GPU (``lab/gpu/offload_truth.sh``)."""\n\n\n'
        "class A:\n"
        '    """Judged by ``moegate.mod.judge``;\n    its page is [docs](docs/none.md)."""\n\n\n'
        "def judge():\n"
        '    """``moegate.mod.A`` and ``moegate/mod.py`` are here."""\n'
        '    text = "not a docstring: lab/none.sh"\n'
    )
    assert problems(tmp_path, pages=(), sources=("moegate",)) == [
        "moegate/mod.py:1: lab/gpu/offload_truth.sh: no such file or folder",
        "moegate/mod.py:6: docs/none.md: no such file or folder",
    ]
