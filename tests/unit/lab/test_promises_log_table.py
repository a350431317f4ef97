"""lab/gpu/promises_log_table.py reads a panel's closing log (lab/gpu/e2e_plan.sh) into one row a pair, with
the figures each promise's clauses judged by: the path balance of the decode rule of 4534779 among them."""

from __future__ import annotations

from lab.gpu.promises_log_table import pairs, row

LOG = """\
== b-decode-host-1: exit 1 wall_ms 329354 base 033 pr 033+naive-host-top1=1.01 model trained gates greedy promise equivalent | identical exit 1
PASS  scored (equivalent), base vs pr: PASS (equivalent): 64 prompts; change per token 0.00038 / 0.00134 = 0.29 (upper 0.46) <= 12.0; x
FAIL  decode (equivalent), 1 in flight: FAIL (equivalent): 5796 decoded tokens of 64 prompts; change per token 0.00774 / 0.00139 = 5.57 (upper 6.79) <= 2.5 (base vs pr, the reference's decode as the yardstick), or path balance: 0.00774 decoded / 0.00035 in prefill on 5796 tokens = 22.24 (upper 71.91) <= 2.5; damage
PASS  greedy (equivalent), 1 in flight: 28 identical, 36 explained (near tie), 0 unexplained of 64 (base vs pr; tie bound 0.6497 nats)
FAIL  decode (identical), 1 in flight: FAIL (identical): 5796 decoded tokens; mean |change| 0.00752 between vs 0.00020 within (each); x
== s-trained: exit 0 wall_ms 343741 base 033 pr 033 model trained gates greedy promise identical | equivalent exit 0
PASS  decode (equivalent), 1 in flight: PASS (equivalent): 8192 decoded tokens of 64 prompts; change per token 0.00000 / 0.00142 = 0.00 (upper 0.00) <= 2.5 (base vs pr, the reference's decode as the yardstick)
"""


def test_each_pair_is_one_row_with_the_decode_paths_balance_where_the_rule_needed_it():
    got = [row(p) for p in pairs(LOG)]
    assert len(got) == 2
    bug, same = (r.split(" | ") for r in got)
    assert bug[5] == "FAIL (decode)" and bug[4] == "FAIL (decode)"
    assert bug[9] == "5.57 (upper 6.79)" and bug[10] == "22.24 (upper 71.91)" and bug[11] == "0"
    assert same[5] == "PASS" and same[9] == "0.00 (upper 0.00)" and same[10] == "-"
