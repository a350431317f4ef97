"""``moegate gate``'s page, ``reports/gate.md``: the verdict a pull request's author reads, and what to do next.

Its first line is the contract the workflow's verdict job reads (``head -1``)::

    # moegate gate: <leg> leg: <PASS|FAIL|RUNNER FAULT>

``<leg>`` is ``kernels`` where a GPU tier ran (the GPU leg runs dispatch and kernels), else ``dispatch``. Then the
build and the tiers, what ran (each tier's attempts, a runner fault's cause and its retry), and each failing case:

- a dispatch mismatch (its ``MOEGATE-MISMATCH`` record, ``moegate.core.check``): the path the spec requires and its
  clause, the path the entrypoint took, the case's numbers, and ``moegate repro`` for it;
- a kernel case outside the tolerance (``moegate.kernels.check.KernelResult.describe``): the entrypoint, path and
  dtype, how far the kernel was from the torch reference against the tolerance (at the worst element: the
  reference's value, the kernel's and the tolerance there), the case's JSON and ``moegate repro --kernels`` for it;
- any other failure (a golden's diff, a lifecycle check): its message.

The reproducing commands name this run's build Python; a user with a vLLM checkout installed into a venv runs the
same command with that venv's Python, from a moegate checkout. ``@example`` lines (``pin it:``, for moegate's own
strategies) appear only in moegate's own development runs (``moegate.core.check.dev_run``). Written whole or not at
all (a temporary file, then a rename).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moegate.core.case import MoECase
from moegate.core.check import EXAMPLE_PREFIX, MARK, parse_mismatches
from moegate.core.faults import Outcome
from moegate.core.golden_files import atomic_write
from moegate.core.junit import Failed
from moegate.core.spec import SPARSITY_FACTOR, experts_counted, in_naive_region

MAX_CASES = 20
MAX_MESSAGE_LINES = 40
_E = r"^(?:E)?[ \t]*"  # pytest's report marks the exception's lines with "E"
_KERNEL = re.compile(
    _E
    + r"(?P<ep>legacy|modular) (?P<short>.*?) dtype=(?P<dtype>\S+) path=(?P<path>\S+): (?P<close>max \|out-ref\|=.*)$",
    re.MULTILINE,
)
_CASE = re.compile(_E + r"case: (\{.*\})\s*$", re.MULTILINE)
_WORST = re.compile(r"at the worst element: (.*)$", re.MULTILINE)


@dataclass
class TierRun:
    """One tier (or the kernel floor) as it ran: every attempt's outcome, the last the verdict."""

    name: str
    outcomes: list[Outcome]
    command: Sequence[str] = ()

    @property
    def verdict(self) -> str:
        return self.outcomes[-1].verdict


@dataclass
class Gate:
    """What the page says: the leg, the build, the tiers' runs, the failing tests of the last pytest run."""

    leg: str
    verdict: str
    label: str
    python: str
    tiers: Sequence[str]
    runs: list[TierRun] = field(default_factory=list)
    failed: list[Failed] = field(default_factory=list)
    junit: Path | None = None
    note: str = ""


def first_line(leg: str, verdict: str) -> str:
    return f"# moegate gate: {leg} leg: {verdict}"


def _repro(python: str, case_json: str, entrypoint: str, kernels: bool) -> str:
    cmd = [python, "-m", "moegate", "repro", *(["--kernels"] if kernels else []), case_json, "--entrypoint", entrypoint]
    return shlex.join(cmd)


def _region(rec: dict[str, Any]) -> str:
    """The naive region's bound for the case, as the rule counts it (``moegate.core.spec``)."""
    try:
        case = MoECase.from_dict(rec["case"])
        ep = str(rec["entrypoint"])
        counted, inside = experts_counted(case, ep), in_naive_region(case, ep)
    except (KeyError, TypeError, ValueError):
        return ""
    pairs = case.pairs * SPARSITY_FACTOR
    return f"; tokens x ids per token x {SPARSITY_FACTOR} = {pairs} {'<=' if inside else '>'} {counted} experts counted"


def _dispatch_case(rec: dict[str, Any], python: str) -> list[str]:
    case = json.dumps(rec["case"], sort_keys=True, separators=(",", ":"))
    ep = str(rec["entrypoint"])
    where = f"placement {rec['placement']}, {rec['tokens']} token(s), top_k {rec['top_k']}, {rec['experts']} experts"
    return [
        f"- **spec requires:** {rec['expected']} ({rec['reason']})",
        f"- **ran:** the {ep} entrypoint took **{rec['observed']}**",
        f"- **case:** {where}{_region(rec)}",
        "",
        "```sh",
        _repro(python, case, ep, kernels=False),
        "```",
    ]


def _kernel_case(text: str, python: str) -> list[str] | None:
    ran, case = _KERNEL.search(text), _CASE.search(text)
    if ran is None or case is None:
        return None
    worst = _WORST.search(text)
    lines = [
        (
            "- **spec requires:** the kernel's output within the tolerance of the torch reference at every element "
            "(`moegate/kernels/reference.py`: worst err/tol <= 1)"
        ),
        f"- **ran:** the {ran['ep']} entrypoint, path {ran['path']}, dtype {ran['dtype']}, {ran['short']}",
        f"- **numbers:** {ran['close']}",
    ]
    if worst:
        lines.append(f"- **at the worst element:** {worst.group(1)}")
    lines += [
        f"- **case:** `{case.group(1)}`",
        "",
        "```sh",
        _repro(python, case.group(1), ran["ep"], kernels=True),
        "```",
    ]
    return lines


def _bare(line: str) -> str:
    """A report line without pytest's ``E`` mark and its indent."""
    return re.sub(_E, "", line)


def _message(text: str, dev: bool) -> list[str]:
    keep = [ln for ln in text.splitlines() if MARK not in ln and (dev or not _bare(ln).startswith(EXAMPLE_PREFIX))]
    shown = keep[:MAX_MESSAGE_LINES]
    more = [f"... ({len(keep) - len(shown)} more lines in the JUnit report)"] if len(keep) > len(shown) else []
    return ["```", *shown, *more, "```"]


def case_block(number: int, failed: Failed, python: str, dev: bool) -> list[str]:
    """One failing test: its dispatch mismatches, else its kernel case, else its message."""
    text = failed.text or failed.message
    lines = [f"### {number}. `{failed.nodeid}`", ""]
    records = list({json.dumps(r, sort_keys=True): r for r in parse_mismatches(text)}.values())
    for i, rec in enumerate(records):
        lines += (["", "Another case of this test:", ""] if i else []) + _dispatch_case(rec, python)
    if not records:
        lines += _kernel_case(text, python) or _message(failed.message or text, dev)
    if dev:
        pins = sorted({_bare(ln) for ln in text.splitlines() if _bare(ln).startswith(EXAMPLE_PREFIX)})
        lines += ["", "Pin it (moegate's own strategies):", "", "```python", *pins, "```"] if pins else []
    return [*lines, ""]


def _attempts(run: TierRun) -> str:
    if len(run.outcomes) == 1:
        return run.outcomes[0].cause
    return "; ".join(f"attempt {i}: {o}" for i, o in enumerate(run.outcomes, 1))


def render(g: Gate, dev: bool) -> str:
    lines = [
        first_line(g.leg, g.verdict),
        "",
        f"Build **{g.label}** (`{g.python}`); tiers: {', '.join(g.tiers)}.",
        "",
    ]
    if g.note:
        lines += [g.note, ""]
    if g.runs:
        lines += ["| tier | verdict | attempts | why |", "| --- | --- | ---: | --- |"]
        lines += [f"| {r.name} | {r.verdict} | {len(r.outcomes)} | {_attempts(r)} |" for r in g.runs]
        lines.append("")
    faults = [r for r in g.runs if len(r.outcomes) > 1]
    if faults:
        lines += ["## Runner faults", ""]
        for r in faults:
            lines.append(f"- {r.name}: the first attempt was a **runner fault** ({r.outcomes[0].cause}); retried once:")
            lines.append(f"  **{r.outcomes[-1].verdict}** ({r.outcomes[-1].cause}).")
        lines += [
            "",
            (
                "A runner fault is the runner's, not the build's: another process's memory on the GPU, a driver error, a"
                " lost runner. It is retried once, and a second one is the verdict: never a pass."
            ),
            "",
        ]
    commands = [r for r in g.runs if r.command]
    if commands:
        lines += ["What ran:", "", "```sh", *(shlex.join(r.command) for r in commands), "```", ""]
    if g.failed:
        lines += [
            f"## Failing tests ({len(g.failed)})",
            "",
            (
                f"Each command reproduces its case from a moegate checkout. `{g.python}` is this run's build; with a"
                " vLLM checkout, run it with the Python of the venv the checkout is installed in (`pip install -e .`)."
            ),
            "",
        ]
        for i, failed in enumerate(g.failed[:MAX_CASES], 1):
            lines += case_block(i, failed, g.python, dev)
        if len(g.failed) > MAX_CASES:
            lines += [f"... and {len(g.failed) - MAX_CASES} more: the JUnit report `{g.junit}`.", ""]
    return "\n".join(lines).rstrip() + "\n"


def write(path: Path, text: str) -> None:
    """``text`` at ``path``, whole or not at all."""
    atomic_write(path, text)
