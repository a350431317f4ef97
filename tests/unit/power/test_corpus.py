"""The real-bug corpus's re-plants: every one applies to vLLM 0.33.0's real files, and a bad one is refused by name.

- each bug of ``power/real-bugs.toml`` re-planted into the installed 0.33.0 (read, never written): its files
  parse, differ from the originals, and differ only inside the functions its edits name (skipped, with where
  it looked, on a machine without that environment);
- an edit whose text its function does not hold (or holds twice), a function the file lacks, an edit that breaks
  the syntax or changes nothing: one line naming the bug, the file and the function;
- the corpus file itself: each bug has its provenance, and a bad file is one line;
- the mirror a bug is planted into: real directories (the census walks them), files linked to the installed
  ones, the edited file a real file of its own.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
from pathlib import Path

import pytest

from moegate import paths
from moegate.census.source import CensusError, locate
from moegate.power import corpus
from moegate.power.corpus import Bug, CorpusError, Edit, apply_edits, parse, scope_span
from moegate.power.corpus_cli import main

RELEASE = "0.33.0"


def installed_vllm() -> Path:
    """vLLM 0.33.0's package folder: this Python's, else the nox environment's (read as text, never imported)."""
    spec = importlib.util.find_spec("vllm")
    found = [Path(next(iter(spec.submodule_search_locations)))] if spec and spec.submodule_search_locations else []
    env = paths.ENVS_DIR / f"_vllm-{RELEASE}"
    found += sorted(env.glob("lib/python3*/site-packages/vllm"))
    for root in found:
        with contextlib.suppress(CensusError):
            if locate(root).version == RELEASE:
                return root
    pytest.skip(f"no vLLM {RELEASE} package: looked at this Python's vllm and in {env} (MOEGATE_ENV_DIR)")


def _functions(text: str) -> dict[str, str]:
    """Every top-level function and method of ``text`` by qualified name, with its source."""
    out: dict[str, str] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            out[node.name] = ast.get_source_segment(text, node) or ""
            for sub in node.body if isinstance(node, ast.ClassDef) else ():
                if isinstance(sub, ast.FunctionDef):
                    out[f"{node.name}.{sub.name}"] = ast.get_source_segment(text, sub) or ""
    return out


BUGS = corpus.load()


@pytest.mark.parametrize("bug", BUGS, ids=lambda b: b.id)
def test_each_bug_replants_into_0_33_0_changing_only_the_functions_it_names(bug: Bug) -> None:
    root = installed_vllm()
    before = {f: (root / f).read_bytes() for f in bug.files}
    edited = corpus.replant(bug, root)
    assert set(edited) == set(bug.files)
    for f, text in edited.items():
        original = before[f].decode()
        assert text != original
        ast.parse(text)
        scopes = {e.scope for e in bug.edits if e.file == f}
        old, new = _functions(original), _functions(text)
        changed = {name for name in old if old[name] != new.get(name)}
        # a method's class changes with it: only the named functions and the classes around them differ
        assert changed <= scopes | {s.split(".")[0] for s in scopes}, changed
        assert all(old[s] != new[s] for s in scopes), scopes
        for e in (e for e in bug.edits if e.file == f):
            assert e.replace in new[e.scope]
    assert {f: (root / f).read_bytes() for f in bug.files} == before  # read, never written


def test_the_corpus_holds_at_least_eight_bugs_each_with_its_upstream_pull_request() -> None:
    assert len(BUGS) >= 8
    for bug in BUGS:
        number = bug.upstream.rsplit("#", 1)[-1]
        assert bug.upstream.startswith("vllm-project/vllm#") and number.isdigit(), bug.id
        assert bug.url == f"https://github.com/vllm-project/vllm/pull/{number}", bug.id
        assert bug.expect != "survives" or bug.survives.strip(), bug.id


SOURCE = """\
def kernel(x):
    y = x.to(int64)
    return y


class Experts:
    def apply(self, n):
        width = n // 2
        return width

    def other(self, n):
        width = n // 2
        return width
"""


def _edit(find: str, replace: str, scope: str = "Experts.apply", count: int = 1) -> Edit:
    return Edit("pkg/mod.py", scope, find, replace, count)


def test_an_edit_replaces_its_text_only_inside_the_function_it_names() -> None:
    out = apply_edits({"pkg/mod.py": SOURCE}, [_edit("n // 2", "n")])["pkg/mod.py"]
    assert _functions(out)["Experts.apply"].count("width = n\n") == 1
    assert _functions(out)["Experts.other"] == _functions(SOURCE)["Experts.other"]
    start, end = scope_span(SOURCE, "kernel")
    assert SOURCE[start:end].startswith("def kernel") and SOURCE[start:end].rstrip().endswith("return y")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_edit("n // 3", "n"), r"bug 'b': pkg/mod.py::Experts.apply holds 'n // 3' 0 times, the re-plant expects 1"),
        (_edit("width", "w"), r"pkg/mod.py::Experts.apply holds 'width' 2 times, the re-plant expects 1"),
        (_edit("n // 2", "n", scope="Experts.gone"), r"bug 'b': pkg/mod.py has no function Experts.gone"),
        (
            _edit(
                "return width",
                "return (",
            ),
            r"bug 'b': the re-planted pkg/mod.py does not parse",
        ),
        (_edit("n // 2", "n // 2"), r"bug 'b': the re-plant leaves pkg/mod.py unchanged"),
    ],
    ids=["absent", "twice", "no-function", "syntax", "no-change"],
)
def test_an_edit_that_does_not_fit_its_function_is_refused_by_name(edit: Edit, message: str) -> None:
    with pytest.raises(CorpusError, match=message):
        apply_edits({"pkg/mod.py": SOURCE}, [edit], where="bug 'b'")


GOOD = """
[[bug]]
id = "b1"
upstream = "vllm-project/vllm#1"
url = "https://github.com/vllm-project/vllm/pull/1"
title = "t"
what = "w"
expect = "kernels"
[[bug.edit]]
file = "pkg/mod.py"
scope = "kernel"
find = "int64"
replace = "int32"
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            GOOD.replace('expect = "kernels"', 'expect = "e2e"'),
            "bug 'b1': 'expect' is one of dispatch, kernels, diff, survives",
        ),
        (GOOD.replace('expect = "kernels"', 'expect = "survives"'), "bug 'b1': 'survives' must be a non-empty string"),
        (GOOD + GOOD, "bug 'b1': the id is used twice"),
        (GOOD.replace('title = "t"', 'title = "t"\ncolour = "red"'), "bug 1: unknown key 'colour'"),
        (GOOD.replace('file = "pkg/mod.py"', 'file = "../mod.py"'), "'file' '../mod.py' must be a .py path inside"),
        (GOOD.split("[[bug.edit]]")[0], "bug 'b1': no \\[\\[bug.edit\\]\\]"),
        ("x = ", "not TOML"),
    ],
    ids=["expect", "unexplained-survivor", "twice", "unknown-key", "outside", "no-edit", "not-toml"],
)
def test_a_bad_corpus_is_one_error_naming_the_bug_and_the_field(text: str, message: str) -> None:
    parse(GOOD)  # the unharmed one parses
    with pytest.raises(CorpusError, match=message):
        parse(text, "c.toml")


def test_a_bad_corpus_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text(GOOD + GOOD)
    assert main(["check", "--vllm-python", "python3", "--corpus", str(bad)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"moegate power corpus: {bad}: bug 'b1': the id is used twice"
    ]
    assert main(["check", "--vllm-python", "python3", "--corpus", str(tmp_path / "none.toml")]) == 2
    assert "cannot read the corpus" in capsys.readouterr().err


def test_an_unknown_bug_id_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--vllm-python", "python3", "--only", "no-such-bug"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("moegate power corpus: --only no-such-bug: no such bug in the corpus") and "\n" not in err


def _package(root: Path) -> Path:
    pkg = root / "site" / "vllm"
    (pkg / "pkg" / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "pkg" / "__init__.py").write_text("")
    (pkg / "pkg" / "mod.py").write_text(SOURCE)
    (pkg / "pkg" / "other.py").write_text("X = 1\n")
    (pkg / "pkg" / "configs.json").write_text("{}")
    (pkg / "pkg" / "__pycache__" / "mod.cpython-312.pyc").write_bytes(b"stale")
    (pkg / "models").mkdir()  # a folder with nothing edited in it (the model files the census reads)
    (pkg / "models" / "moe.py").write_text("Y = 2\n")
    return pkg


def test_the_mirror_is_real_folders_of_linked_files_with_the_edited_file_its_own(tmp_path: Path) -> None:
    pkg = _package(tmp_path)
    bug = parse(GOOD)[0]
    overlay = corpus.plant(bug, pkg, tmp_path / "overlay")
    copy = overlay / "vllm"
    # the census walks the package with rglob, which does not enter a linked folder: every .py must be found
    assert sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*.py")) == [
        "__init__.py", "models/moe.py", "pkg/__init__.py", "pkg/mod.py", "pkg/other.py",
    ]  # fmt: skip
    assert not any(p.is_symlink() for p in copy.rglob("*") if p.is_dir())
    assert (copy / "pkg" / "other.py").is_symlink() and (copy / "pkg" / "configs.json").is_symlink()
    assert not (copy / "pkg" / "__pycache__").exists()  # no stale bytecode of the unedited file
    edited = copy / "pkg" / "mod.py"
    assert not edited.is_symlink() and os.stat(edited).st_ino != os.stat(pkg / "pkg" / "mod.py").st_ino
    assert "x.to(int32)" in edited.read_text()
    assert (pkg / "pkg" / "mod.py").read_text() == SOURCE  # the installed file is only read
    base = corpus.plant(None, pkg, tmp_path / "base")
    assert (base / "vllm" / "pkg" / "mod.py").is_symlink()  # the baseline: the same mirror, no edit
