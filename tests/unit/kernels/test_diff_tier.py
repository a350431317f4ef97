"""``moegate diff`` on a CPU: two real builds (``moegate.builds.planted`` interpreters), one worker in each, the
same cases fed to both, paired here and judged; the kernel is ``tests.support.diff_standin``'s CPU stand-in (never a
GPU result), the planted changes the real ones. And what is not judged: other Pythons, a base that cannot start
(exit 2), a PR that cannot (a FAIL)."""

from __future__ import annotations

import functools
import shlex
import sys
from pathlib import Path

import pytest
import torch

from moegate.builds.planted import make_build
from moegate.core.case import MoECase, Routing
from moegate.kernels import diff_tier
from moegate.kernels.differential import encode, judge
from moegate.kernels.workers import Options, Pool
from tests.support.diff_standin import DiffStandIn, write_site

OTHER_MINOR = "3.11" if sys.version_info[:2] != (3, 11) else "3.12"
OTHER_PYTHON = Path.home() / ".cache" / "moegate" / "envs" / f"_unit-{OTHER_MINOR}" / "bin" / "python"
"""The unit tier's other interpreter (``nox -s unit`` runs 3.11 and 3.12): a base build of another Python."""
CASES = [
    (MoECase(num_tokens=5 + i % 8, top_k=1 + i % 3, num_experts=16, hidden=128, intermediate=128, routing=Routing(seed=i)), ep)
    for i, ep in enumerate(["legacy", "modular"] * 6)
]  # fmt: skip
"""Twelve cases, all on the sorted path (5+ tokens of 16 experts): one group, enough to judge at 1 %."""


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A base, a PR with one more rounding in its epilogue, and a build without the stand-in vLLM."""
    tmp = tmp_path_factory.mktemp("diff")
    site = write_site(tmp / "site")
    made = {name: make_build(tmp / name, sys.executable, sites=[str(site)], bug=bug) for name, bug in
            (("base", None), ("pr", "moe-reround=3"))}  # fmt: skip
    made["bare"] = make_build(tmp / "bare", sys.executable)
    return {name: str(path) for name, path in made.items()}


def _run(base: str, pr: str, cases=CASES) -> diff_tier.Runs:
    return diff_tier.run_builds(base, pr, cases, n=0, seed=0, runs=1, budget_s=300, say=print, runner=DiffStandIn)


def test_one_more_rounding_in_the_prs_epilogue_fails_and_the_printed_reproducer_runs_it_in_both_builds(
    builds, monkeypatch, capsys
):
    """Each worker runs in its own build (its executable, its plant); the same cases pair up; the rounding FAILs
    both promises, and ``identical``'s reproducer, run as printed, finds the difference again."""
    base, pr = builds["base"], builds["pr"]
    r = _run(base, pr)
    assert (r.info["base"]["executable"], r.info["pr"]["executable"]) == (base, pr)
    assert r.info["pr"]["plant"] == "moe-reround=3" and r.info["base"]["plant"] is None
    assert sorted(o.index for o in r.outcomes[0]) == list(range(len(CASES)))
    equivalent = judge(r.outcomes[0], "equivalent", len(CASES))
    assert not equivalent.ok and equivalent.rejected == {"bfloat16 sorted"}
    identical = judge(r.outcomes[0], "identical", len(CASES))
    assert not identical.ok and identical.finding is not None and identical.differing == len(CASES)
    command = shlex.split(identical.lines(base, pr)[-1].removeprefix("  reproduce: "))
    assert command[:4] == [pr, "-m", "moegate", "diff"]
    monkeypatch.setattr(diff_tier, "DiffRunner", DiffStandIn)  # the command's own runner needs a GPU
    capsys.readouterr()
    assert diff_tier.main(command[4:]) == 1
    out = capsys.readouterr().out
    assert '"identical": false' in out and f"base {base}, PR {pr}; promise identical" in out


def test_builds_of_two_pythons_are_not_judged_in_one_line(capsys):
    if not OTHER_PYTHON.is_file():
        pytest.skip(f"needs a Python of another minor version at {OTHER_PYTHON} (the unit tier's other env)")
    assert diff_tier.main(["--base-python", str(OTHER_PYTHON), "--pr-python", sys.executable]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert line == (
        f"moegate diff: not judged: the base build runs Python {OTHER_MINOR} and the PR build Python {here}: "
        "the tier compares builds of one Python"
    )


def test_a_base_that_cannot_run_the_cases_is_not_judged_and_a_pr_that_cannot_is_a_fail(builds):
    """A build without vLLM (here: without the stand-in) cannot start its worker: the base's is no verdict, the
    PR's is the PR's fault."""
    bare = builds["bare"]
    with Pool(1, functools.partial(DiffStandIn, reference=True), Options(60, False), python=bare) as pool:
        pool.launch()
        with pytest.raises(diff_tier.NotJudged, match=r"the base build \(.*bare.*\) cannot run the tier's cases"):
            diff_tier._started(pool, "base", bare)
        with pytest.raises(diff_tier.PrFailed, match=r"the pr build \(.*bare.*\) cannot run the tier's cases"):
            diff_tier._started(pool, "pr", bare)


def test_payloads_pair_with_the_cases_as_fed_past_the_ones_a_worker_skipped():
    """One worker a build takes the cases in order; one it skipped past the budget sends nothing."""
    pairing = diff_tier.Pairing()
    for i, (case, ep) in enumerate(CASES[:3]):
        pairing.submit(0, i, case, ep)
    out = torch.ones(2, 4, dtype=torch.bfloat16)

    def payload(i: int, side: str) -> dict:
        case, ep = CASES[i]
        p = {"key": [ep, case.to_json()], "inputs": "x", "path": "sorted", "output": encode(out)}
        return p | ({"reference": encode(out.float()), "magnitude": encode(out.float())} if side == "base" else {})

    for i in (0, 2):
        pairing.add("base", payload(i, "base"))
    for i in (0, 1, 2):
        pairing.add("pr", payload(i, "pr"))
    assert sorted(o.index for o in pairing.outcomes[0]) == [0, 2]
    with pytest.raises(RuntimeError, match="never submitted"):
        diff_tier.Pairing().add("base", payload(0, "base"))


def test_builds_on_two_gpus_do_not_compare():
    same = {"python": "3.12.1", "device": "NVIDIA H200 (sm_90)"}
    assert diff_tier.comparable(same, {**same, "python": "3.12.3"}) is None
    why = diff_tier.comparable(same, {**same, "device": "NVIDIA H100 (sm_90)"})
    assert (
        why
        == "the base build runs GPU NVIDIA H200 (sm_90) and the PR build GPU NVIDIA H100 (sm_90): the tier compares builds on one GPU"
    )
