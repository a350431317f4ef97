"""The e2e tier's rules: one module per gate, and ``judge``, which asks each of them about one run's data.

- ``identical``: the scored comparison (``stats.decide``: shift, spread, one token);
- ``greedy``: token equality, and its batch-robust classification (identical, near tie, unexplained);
- ``gsm8k``: byte identity of responses, and the exact McNemar test with each divergence judged;
- ``golden``: one build's records against the golden of its key;
- ``noise``: the tie bounds the run measures of itself.

Nothing here serves or reads files: ``judge`` takes what ``moegate/e2e/pair.py`` measured (or what
``moegate/e2e/data.py`` read back) and returns the verdicts in the order the report shows them.
"""

from __future__ import annotations

from moegate.e2e.data import BuildRun, Options, ScoreData, gsm8k_cap
from moegate.e2e.greedy import Decode
from moegate.e2e.rules import golden, greedy, gsm8k, identical, noise
from moegate.e2e.verdict import GateResult


def judge(
    base: BuildRun, pr: BuildRun, opts: Options, decode: Decode | None, data: ScoreData | None
) -> list[GateResult]:
    """Every gate's verdict. Strict: byte identity (``judge_strict``); else the rules of docs/e2e-rules.md."""
    if opts.strict:
        return judge_strict(base, pr, opts, decode)
    if data is None or not data.sequences:
        return [
            GateResult("scored", False, "no scores: the scoring phase did not run (use --strict for byte identity)")
        ]
    tie = noise.tie_bound(data)
    results: list[GateResult] = [identical.scored_result(data, detect=opts.score_detect)]
    if "greedy" in opts.gates:
        for c in opts.in_flight:
            pairs = [(f"greedy, {r.build.label} twice, {c} in flight", "first", r.greedy[c], "second", r.repeat[c])
                     for r in (base, pr) if c in r.repeat]  # fmt: skip
            pairs.append((f"greedy, {c} in flight", base.build.label, base.greedy[c], pr.build.label, pr.greedy[c]))
            for gate, la, a, lb, b in pairs:
                res = greedy.compare(la, a, lb, b, gate=gate, decode=decode)
                results.append(greedy.classify(res, la, lb, len(a), tie))
            for r in (base, pr):
                results.append(golden.check_golden("greedy", r, opts, c, decode))
    if "gsm8k" in opts.gates:
        repeats = [(r.build.label, r.gsm8k, r.gsm8k_repeat) for r in (base, pr) if r.gsm8k_repeat is not None]
        for lab, r1, r2 in repeats:
            results.append(gsm8k.noise_row(lab, r1, r2))
        results.append(
            gsm8k.gsm8k_result(
                (base.build.label, pr.build.label), base.gsm8k, pr.gsm8k, repeats, data.gsm8k_divergences,
                noise.gsm8k_tie_bound(data, {r.build.label: r.greedy.get(1, []) for r in (base, pr)}),
                detect=opts.gsm8k_detect, cap=gsm8k_cap(opts),
            )
        )  # fmt: skip
        for r in (base, pr):
            results.append(golden.check_golden("gsm8k", r, opts, None, None))
    return results


def judge_strict(base: BuildRun, pr: BuildRun, opts: Options, decode: Decode | None) -> list[GateResult]:
    """Byte identity: every greedy token and every GSM8K response, each build first against its own repeat."""
    results: list[GateResult] = []
    if "greedy" in opts.gates:
        for c in opts.in_flight:
            stable = []
            for r in (base, pr):
                if c in r.repeat:
                    res = greedy.compare(
                        "first", r.greedy[c], "second", r.repeat[c], gate=f"greedy, {r.build.label} twice, {c} in flight",
                        decode=decode,
                    )  # fmt: skip
                    results.append(res)
                    stable.append(res.passed)
            res = greedy.compare(
                base.build.label, base.greedy[c], pr.build.label, pr.greedy[c], gate=f"greedy, {c} in flight",
                decode=decode,
            )  # fmt: skip
            if not all(stable):
                res.passed = False
                res.summary = (
                    f"FAIL (strict): a build does not reproduce itself at {c} in flight (see above), so byte "
                    f"identity cannot hold here; drop --strict for the batch-robust rules; between builds: {res.summary}"
                )
            results.append(res)
            for r in (base, pr):
                results.append(golden.check_golden("greedy", r, opts, c, decode))
    if "gsm8k" in opts.gates:
        stable = []
        for r in (base, pr):
            if r.gsm8k_repeat is not None:
                res = gsm8k.compare_runs(r.gsm8k, r.gsm8k_repeat, labels=("first", "second"))
                res.gate = f"gsm8k, {r.build.label} twice"
                results.append(res)
                stable.append(res.passed)
        res = gsm8k.compare_runs(base.gsm8k, pr.gsm8k, labels=(base.build.label, pr.build.label))
        if not all(stable):
            res.passed = False
            res.summary = (
                "FAIL (strict): a build's GSM8K responses do not reproduce themselves (see above), so byte "
                f"identity cannot hold here; drop --strict for the batch-robust rules; between builds: {res.summary}"
            )
        results.append(res)
        for r in (base, pr):
            results.append(golden.check_golden("gsm8k", r, opts, None, None))
    return results
