"""The H200 promise panel's plan files are what issue 29 asks of the panel, and every line is one the plan script runs.

``lab/gpu/e2e_plan.sh`` reads ``LABEL MODEL BASE PR GATES [PROMISE]`` (its header says what each word may be).
The lead runs the plans on a GPU with no chance of a second try, so the grammar is checked here: every
planted change parses (``moegate.builds.planted.parse_bug``), every variant, model, gate set and promise is one
the script knows; and the panel holds at least six harmless changes and six bugs, two bugs confined to
small-batch decode with host-resident weights, two of at most 1 %, and the same build against itself on both
models.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moegate.builds.planted import HARMLESS, parse_bug
from moegate.e2e.run_data import GATES, PROMISES
from tests.support import ROOT

PLANS = sorted((ROOT / "lab" / "gpu" / "plans").glob("promises-*.plan"))
DESIGN = sorted((ROOT / "lab" / "gpu" / "plans").glob("design-*.plan"))  # a rule's tuning data, apart from the panel
PROBES = [ROOT / "lab" / "gpu" / "plans" / p for p in ("personality.plan", "eager-identical.plan")]
SCRIPT = (ROOT / "lab" / "gpu" / "e2e_plan.sh").read_text()
VARIANTS = set(re.findall(r"\*@([a-z-]+)\*\)", SCRIPT))
MODELS = ("random", "trained", "random-fp8")
HARMLESS_VARIANTS = {
    "res",
    "eager",
    "triton-attn",
    "tuned",
    "batchinv",
    "cublasws",
    "nocompile",
    "nographs",
    "rmsnorm-op",
}


def _build(tok: str) -> tuple[str, dict | None, list[str]]:
    m = re.fullmatch(r"(03[23])(?:\+([^@]+))?((?:@[a-z-]+)*)", tok)
    assert m, f"build token {tok!r} is not VERSION[+BUG][@VARIANT]"
    variants = [v for v in m.group(3).split("@") if v]
    return m.group(1), (parse_bug(m.group(2)) if m.group(2) else None), variants


def _lines(plans: list[Path] = PLANS) -> list[tuple[Path, list[str]]]:
    out = []
    for plan in plans:
        for line in plan.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                out.append((plan, line.split()))
    return out


def test_the_promise_plans_exist_and_the_script_knows_their_variants():
    assert [p.name for p in PLANS] == ["promises-a.plan", "promises-b.plan"]
    assert VARIANTS == HARMLESS_VARIANTS, VARIANTS


@pytest.mark.parametrize(
    ("plan", "words"), _lines(PLANS + DESIGN + PROBES), ids=lambda x: x.name if isinstance(x, Path) else x[0]
)
def test_every_plan_line_is_one_the_script_runs(plan, words):
    assert len(words) in (5, 6), words
    _label, model, base, pr, gates, *promise = words
    assert model in MODELS and all(g in GATES for g in gates.split(",")) and (promise or ["identical"])[0] in PROMISES
    for tok in (base, pr):
        _, _, variants = _build(tok)
        assert set(variants) <= VARIANTS, (tok, variants)


def _kind(base: str, pr: str) -> str:
    (vb, bug_b, var_b), (vp, bug_p, var_p) = _build(base), _build(pr)
    if bug_p is not None and bug_p["kind"] not in HARMLESS:
        return "bug"
    if bug_b is None and bug_p is None and vb == vp and var_b == var_p:
        return "same"
    return "harmless"


def _size(bug: dict) -> float:
    """A planted error's relative size: its factor's distance from 1 (gross kinds count as 1)."""
    return next((abs(bug[k] - 1) for k in ("factor", "weights", "scale") if k in bug), 1.0)


def test_the_panel_holds_what_issue_29_asks():
    lines = [w for _, w in _lines()]
    labels = [w[0] for w in lines]
    assert len(labels) == len(set(labels)), "labels name the pairs' folders: they must be unique"
    kinds = {w[0]: _kind(w[2], w[3]) for w in lines}
    harmless = [k for k, v in kinds.items() if v == "harmless" and "fp8" not in k]
    bugs: dict[str, dict] = {w[0]: _build(w[3])[1] or {} for w in lines if kinds[w[0]] == "bug"}
    assert len(harmless) >= 6, harmless
    assert len(bugs) >= 6, bugs
    decode_host = [k for k, bug in bugs.items() if bug["kind"] == "naive-host-top1"]
    assert len(decode_host) >= 2, decode_host
    small = [k for k, bug in bugs.items() if _size(bug) <= 0.01 + 1e-12]
    assert len(small) >= 2, small
    same = {w[1] for w in lines if kinds[w[0]] == "same"}
    assert {"random", "trained"} <= same, same
    # harmless changes are judged by `equivalent` unless bit-identical is expected; bugs must fail both, and the
    # plan script judges the other promise from the same folder, so either column may be the run's own
    assert all((w + ["identical"])[5] == "equivalent" or w[0] in ("h-tuned", "h-res-uva", "h-032-033") for w in lines
               if kinds[w[0]] == "harmless" and "fp8" not in w[1])  # fmt: skip


def test_graphs_are_on_unless_a_pair_asks_for_eager():
    args = re.search(r'ARGS=\$\{SERVER_ARGS:-"([^"]+)"\}', SCRIPT, re.DOTALL)
    assert args and "--enforce-eager" not in args.group(1) and "--kv-cache-memory-bytes" in args.group(1)
