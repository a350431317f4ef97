"""Every committed plan of ``lab/gpu/plans/`` reads as ``lab/gpu/e2e_plan.sh`` reads it: a typo in a plan is
found here, not in a device call of a 30-minute budget (the script would skip the line or build the wrong thing)."""

from __future__ import annotations

import re

import pytest

from moegate.builds.planted import BuildError, parse_bug
from tests.support import ROOT

PLANS = sorted((ROOT / "lab" / "gpu" / "plans").glob("*.plan"))
SCRIPT = (ROOT / "lab" / "gpu" / "e2e_plan.sh").read_text()
VARIANTS = set(re.findall(r"\*@([a-z0-9-]+)\*", SCRIPT))  # the script's own `case` arms: *@eager*) ...
MODELS = {"random", "trained", "random-fp8"}
BUILD = re.compile(r"^(?P<version>03[23])(?:\+(?P<bug>[^@]+))?(?P<variants>(?:@[a-z0-9-]+)*)$")


def plan_lines(path):
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if line:
            yield n, line.split()


def build_problem(token: str) -> str | None:
    m = BUILD.match(token)
    if m is None:
        return f"{token!r} is not VERSION[+BUG][@VARIANT...]"
    unknown = [v for v in m["variants"].split("@")[1:] if v not in VARIANTS]
    if unknown:
        return f"{token!r}: variant {unknown[0]!r} is none of e2e_plan.sh's {sorted(VARIANTS)}"
    if m["bug"]:
        try:
            parse_bug(m["bug"])
        except BuildError as exc:
            return f"{token!r}: {exc}"
    return None


def test_the_script_has_the_variants_its_header_names():
    assert {"res", "eager", "triton-attn", "tuned", "batchinv"} <= VARIANTS


@pytest.mark.parametrize("plan", PLANS, ids=[p.stem for p in PLANS])
def test_every_line_of_a_committed_plan_names_a_model_two_builds_gates_and_a_promise(plan):
    labels = []
    for n, fields in plan_lines(plan):
        where = f"{plan.name}:{n}"
        assert len(fields) in (5, 6), f"{where}: LABEL MODEL BASE PR GATES [PROMISE], got {fields}"
        label, model, base, pr, gates = fields[:5]
        assert re.fullmatch(r"[A-Za-z0-9._-]+", label), f"{where}: label {label!r}"
        assert model in MODELS, f"{where}: model {model!r}"
        for token in (base, pr):
            problem = build_problem(token)
            assert problem is None, f"{where}: {problem}"
        assert gates in ("greedy", "greedy,gsm8k"), f"{where}: gates {gates!r}"
        assert fields[5:] in ([], ["identical"], ["equivalent"]), f"{where}: promise {fields[5:]}"
        labels.append(label)
    assert labels, f"{plan.name}: no pairs"
    assert len(labels) == len(set(labels)), f"{plan.name}: a label twice (their archives would overwrite)"


@pytest.mark.parametrize(
    ("token", "said"),
    [
        ("033@eagre", "variant 'eagre'"),
        ("033+naive-host-top1=1@eager", "other than 1"),
        ("034@eager", "is not VERSION"),
        ("033+reround7", "expected KIND=VALUE"),
    ],
)
def test_a_mistyped_build_is_caught_with_what_is_wrong(token, said):
    problem = build_problem(token)
    assert problem is not None and said in problem
