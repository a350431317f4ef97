"""The report's page and JSON stay small as GPU records grow: variants summed up per kernel, unreached functions counted."""

from __future__ import annotations

from moegate.reach import report
from moegate.reach import requirements as rq
from tests.unit.reach.test_evaluate import FUNCTIONS, judge, record


def test_a_kernels_variants_are_one_row_with_each_flags_values_and_divisibility_in_all_or_some():
    variants = [{"kernel": rq.KERNEL, "flags": {"HAS_BIAS": v}, "divisible": ["K", "N"] if v else ["K"], "types": {},
                 "ones": ["stride_cn"] if v else []} for v in (True, False)]  # fmt: skip
    page = report.render_markdown(judge(record(["dispatch", "kernels"], specialisations=variants, conditions={})), "c")
    rows = [line for line in page.splitlines() if line.startswith(f"| `{rq.KERNEL}`")]
    assert rows == [f"| `{rq.KERNEL}` | 2 | HAS_BIAS=False/True | K | N | stride_cn |"]


def test_the_json_lists_a_reached_functions_arcs_and_counts_an_unreached_ones_by_reason():
    branches = report.to_json(judge(record(["dispatch"], reached=FUNCTIONS[1:])), "c")["branches"]
    assert branches[FUNCTIONS[1]] == {"reached": True, "arcs": [[1, 2, 1, 1], [1, 3, 0, 1]]}
    assert branches[FUNCTIONS[0]] == {"reached": False, "untaken": {"none": 2}}
