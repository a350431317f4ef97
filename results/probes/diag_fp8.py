"""Where does the fp8 kernel/reference gap come from? Per stage, on the cases that failed."""

import json, os, torch, torch.nn.functional as F
from moegate.case import MoECase
from moegate.vllm.target import VllmTarget
from moegate.kernel_inputs import WeightBank
from moegate.reference import quantize_activation, dequantize, reference_moe
import vllm._custom_ops as ops_mod

t = VllmTarget(finish=True)
bank = WeightBank(t.device, t.host_view)
rec = []


def wrap(mod, name):
    real = getattr(mod, name)

    def w(*a, **k):
        out = real(*a, **k)
        cl = lambda v: v.clone() if isinstance(v, torch.Tensor) else v
        rec.append((name, (tuple(cl(v) for v in a), {kk: cl(v) for kk, v in k.items()}), tuple(cl(v) for v in out)))
        return out

    setattr(mod, name, w)


for m in (t.fm, t.tm):
    wrap(m, "moe_kernel_quantize_input")
if hasattr(ops_mod, "silu_and_mul_per_block_quant"):
    wrap(ops_mod, "silu_and_mul_per_block_quant")
if hasattr(t.tm, "ops") and hasattr(t.tm.ops, "silu_and_mul_per_block_quant") and t.tm.ops is not ops_mod:
    wrap(t.tm.ops, "silu_and_mul_per_block_quant")


def deq(q, s, g, cols):
    q = q.float()
    if s.numel() == 1:
        return q * s.float().reshape(())
    if s.dim() == 2 and s.shape[1] == 1:
        return q * s.float()
    return q * s.float().repeat_interleave(g, dim=1)[:, :cols]


CASES = [
    '{"apply_router_weight_on_input":false,"dtype":"bfloat16","expert_map":null,"hidden":2048,"intermediate":768,"num_experts":128,"num_tokens":1,"placement":{"w13_host":false,"w2_host":false},"quant":{"group_size":0,"scheme":"fp8_w8a8"},"routing":{"kind":"uniform","pool":0,"seed":67},"top_k":1}',
    '{"apply_router_weight_on_input":false,"dtype":"float16","expert_map":null,"hidden":256,"intermediate":128,"num_experts":64,"num_tokens":1,"placement":{"w13_host":false,"w2_host":false},"quant":{"group_size":0,"scheme":"fp8_w8a8"},"routing":{"kind":"uniform","pool":0,"seed":1},"top_k":2}',
    '{"apply_router_weight_on_input":false,"dtype":"float16","expert_map":null,"hidden":512,"intermediate":256,"num_experts":256,"num_tokens":17,"placement":{"w13_host":true,"w2_host":false},"quant":{"group_size":128,"scheme":"fp8_w8a8"},"routing":{"kind":"uniform","pool":0,"seed":5},"top_k":4}',
    '{"apply_router_weight_on_input":false,"dtype":"bfloat16","expert_map":null,"hidden":512,"intermediate":256,"num_experts":256,"num_tokens":17,"placement":{"w13_host":true,"w2_host":false},"quant":{"group_size":128,"scheme":"fp8_w8a8"},"routing":{"kind":"uniform","pool":0,"seed":5},"top_k":4}',
    '{"apply_router_weight_on_input":false,"dtype":"bfloat16","expert_map":null,"hidden":2048,"intermediate":768,"num_experts":128,"num_tokens":4,"placement":{"w13_host":false,"w2_host":false},"quant":{"group_size":128,"scheme":"fp8_w8a8"},"routing":{"kind":"uniform","pool":0,"seed":3},"top_k":8}',
]
results = []
for js in CASES:
    case = MoECase.from_json(js)
    q = case.quant
    g = q.group_size
    for ep in ("legacy", "modular"):
        ts, w1, w2 = bank.inputs(case)
        rec.clear()
        obs = t.run_placed(case, ep, ts, w1, w2)
        torch.cuda.synchronize()
        names = [r[0] for r in rec]
        r = {
            "case": case.short() + f" dtype={case.dtype} K={case.hidden} N={case.intermediate}",
            "ep": ep,
            "calls": names,
        }
        # stage 1: input quantization
        (_, (a, k), (xq, xs)) = rec[0]
        x = ts.hidden_states
        xk = deq(xq, xs, g, case.hidden)
        xr = quantize_activation(x, q)
        r["input_scale"] = [float(xs.float().flatten()[0]), float((x.float().abs().max() / 448))]
        r["input_mismatch_frac"] = float((xk != xr).float().mean())
        # stage 2: GEMM1 (+act) from the kernel's own quantized input
        ids = ts.topk_ids.long()
        M, TK = ids.shape
        N = case.intermediate
        W1 = dequantize(ts.w1, ts.w1_scale, q)
        W2 = dequantize(ts.w2, ts.w2_scale, q)
        h = torch.einsum("mk,mnk->mn", xk.repeat_interleave(TK, 0), W1[ids.flatten()])  # [M*TK, 2N]
        act_ref = F.silu(h[:, :N]) * h[:, N:]
        second = rec[1]
        if second[0] == "silu_and_mul_per_block_quant":
            (a2, k2) = second[1]
            cache1 = a2[0] if a2 else k2.get("input", k2.get("x"))
            hk = cache1.float().reshape(M * TK, 2 * N)
            r["gemm1_rel_err"] = float((hk - h).abs().max() / h.abs().max())
            act_k = F.silu(hk[:, :N]) * hk[:, N:]
            q2, s2 = second[2]
        else:
            (a2, k2) = second[1]
            A2 = k2.get("A", a2[0] if a2 else None)
            act_k = A2.float().reshape(M * TK, N)
            q2, s2 = second[2]
        r["act_rel_err"] = float((act_k - act_ref).abs().max() / act_ref.abs().max())
        aqk = deq(q2, s2, g, N).reshape(M * TK, N)
        aqr = quantize_activation(act_k, q)
        r["act_quant_mismatch_frac_given_kernel_act"] = float((aqk != aqr).float().mean())
        r["act_scale"] = [
            float(s2.float().flatten()[0]),
            float(act_k.abs().max() / 448) if g <= 0 else float(act_k[0, :g].abs().max() / 448),
        ]
        # stage 3: GEMM2 from the kernel's own quantized intermediate
        y = torch.einsum("pn,pkn->pk", aqk, W2[ids.flatten()]) * ts.topk_weights.flatten()[:, None]
        out_ref = y.reshape(M, TK, -1).sum(1)
        mag = y.abs().reshape(M, TK, -1).sum(1)
        rms = mag.pow(2).mean(-1, keepdim=True).sqrt()
        err = (obs.output.float() - out_ref).abs()
        r["gemm2_err_units_bf16"] = float((err / (2**-8 * (mag + rms))).max())
        full = reference_moe(
            ts.hidden_states,
            ts.w1,
            ts.w2,
            ts.topk_weights,
            ts.topk_ids,
            quant=q,
            w1_scale=ts.w1_scale,
            w2_scale=ts.w2_scale,
        )
        e2 = (obs.output.float() - full.output).abs()
        r["full_err_units_bf16"] = float(
            (e2 / (2**-8 * (full.magnitude + full.magnitude.pow(2).mean(-1, keepdim=True).sqrt()))).max()
        )
        results.append(r)
        print(json.dumps(r), flush=True)
json.dump(results, open(os.path.join(os.environ.get("OUT", "."), "diag_fp8.json"), "w"), indent=1)
