"""Probe: legacy fused_experts, fp8 per-tensor dynamic scales, expert map: does stale memory reach the output?"""

import json, os, sys, torch
from moegate.case import MoECase, Quant, ExpertMap
from moegate.vllm.target import VllmTarget
from moegate.kernel_inputs import WeightBank
from moegate.kernel_check import reference_for
from moegate.reference import compare

t = VllmTarget(finish=True)
bank = WeightBank(t.device, t.host_view)
res = []
for ep in ("legacy", "modular"):
    for fill in ("none", "big", "nan"):
        case = MoECase(
            num_tokens=4,
            top_k=8,
            num_experts=64,
            hidden=256,
            intermediate=128,
            expert_map=ExpertMap(2, 1),
            quant=Quant("fp8_w8a8", 0),
        )
        ts, w1, w2 = bank.inputs(case)
        m, k, n = 4, 256, 128
        if fill != "none":
            junk = torch.full(
                (m * 8 * max(2 * n, k),), 1e4 if fill == "big" else float("nan"), dtype=torch.bfloat16, device="cuda"
            )
            del junk
        obs = t.run_placed(case, ep, ts, w1, w2)
        c = compare(obs.output, reference_for(case, ts), torch.bfloat16, case.quant)
        res.append({"entrypoint": ep, "stale_fill": fill, "path": obs.path, "closeness": str(c), "ok": c.ok})
        print(res[-1], flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "probe_fp8_ep.json"), "w"), indent=1)
