"""The user's pages (README and docs/ outside docs/design/) hold at most 8,000 words (tooling/word_count.py)."""

from __future__ import annotations

import subprocess

from tests.support import ROOT
from tooling import word_count


def test_the_users_pages_hold_at_most_8000_words():
    pages = word_count.count(ROOT)
    total = sum(pages.values())
    biggest = ", ".join(f"{p} {n:,}" for p, n in sorted(pages.items(), key=lambda kv: -kv[1])[:3])
    assert total <= word_count.LIMIT, (
        f"{total:,} words in the user's pages (most: {biggest}): move a derivation or a measurement narrative under docs/design/"
    )


def test_the_readme_and_every_page_of_docs_count_and_the_design_pages_do_not():
    counted = set(word_count.count(ROOT))
    assert {"README.md", "docs/adopt.md", "docs/glossary.md", "docs/spec.md"} <= counted
    assert not [p for p in counted if p.startswith("docs/design/")]
    assert (ROOT / "docs" / "design").is_dir() and list((ROOT / "docs" / "design").glob("*.md"))


def test_a_word_is_what_wc_counts():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    wc = subprocess.run(["wc", "-w"], input=text, capture_output=True, text=True, check=True)
    assert word_count.words(text) == int(wc.stdout.split()[0])


def test_over_the_limit_the_check_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
    (tmp_path / "docs" / "design").mkdir(parents=True)
    (tmp_path / "README.md").write_text("word " * 10)
    (tmp_path / "docs" / "a.md").write_text("word " * 5)
    (tmp_path / "docs" / "design" / "long.md").write_text("word " * 100)
    monkeypatch.setattr(word_count, "ROOT", tmp_path)
    monkeypatch.setattr(word_count, "LIMIT", 14)
    assert word_count.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "     15  total (limit 14)"
    assert err == "the user's pages hold 15 words, over the 14 limit\n"
    monkeypatch.setattr(word_count, "LIMIT", 15)
    assert word_count.main(["--check"]) == 0
