"""The dispatch-table golden: the installed vLLM's path for every canonical grid case."""

from __future__ import annotations

from moegate.core import dispatch_table, golden_files
from moegate.core.spec import CLAUSES
from moegate.dispatch.environment import describe_environment

GOLDEN = "dispatch-table.tsv"


def test_dispatch_table_matches_golden(target, bless):
    text = dispatch_table.render(lambda case, ep: target.run(case, ep).path)
    env = describe_environment()
    header = golden_files.provenance_header(
        {
            "what": "path taken by each fused-MoE entrypoint over moegate.core.dispatch_table.grid()",
            "produced by": "nox -s bless -- dispatch-table.tsv",
            "vllm": env["vllm"],
            "torch": env["torch"],
            "device": env.get("gpu", "cpu (calls stopped at the first kernel launch)"),
            "spec": "the clause that decides each entrypoint's path (moegate spec '<case json>' prints its arithmetic):",
            **{f"  {name}": text for name, text in CLAUSES.items()},
        }
    )
    golden_files.check(GOLDEN, header + text, bless=bless)
