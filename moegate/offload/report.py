"""The offload-truth page (``results/offload-truth.md``): one row per run, its findings, where layer 0's expert weights live, the pinned rounding."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_FINDINGS = 6


def _mib(n: Any) -> str:
    return "-" if n is None else f"{int(n) / (1 << 20):,.2f}"


def _outcome(r: Mapping[str, Any]) -> str:
    if r.get("verdict") is None:
        return f"did not complete ({r.get('error')})"
    return r["verdict"]


def _row(r: Mapping[str, Any]) -> str:
    run, fig = r["run"], r.get("figures") or {}
    pinned = fig.get("pinned") or {}
    rounding = (
        "-" if not pinned.get("weight_bytes") else f"{_mib(pinned['held_bytes'])} / {_mib(pinned['weight_bytes'])}"
    )
    rules = sorted({f["rule"] for f in r.get("findings", [])})
    met = "yes" if r["met"] else "**NO**"
    return (
        f"| `{run['name']}` | {run['checkpoint']} | {run['moe_backend']} | {run['budget']} | {run['bug'] or 'clean'} "
        f"| {run['expect']} | {_outcome(r)} | {met} | {_mib(fig.get('expected_host_bytes'))} | {_mib(fig.get('host_bytes'))} "
        f"| {_mib(fig.get('device_bytes'))} | {_mib(fig.get('offloader_accounted_bytes'))} | {rounding} "
        f"| {', '.join(rules) or '-'} |"
    )


def _layer0(r: Mapping[str, Any]) -> list[str]:
    rows = (r.get("layers") or {}).get("0") or []
    if not rows:
        return []
    out = [
        "",
        "| parameter | dtype | bytes | marked | driver says | budget says |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    out += [
        f"| `{p['param']}` | {p['dtype']} | {p['nbytes']:,} | {'yes' if p['marked'] else 'no'} | {p['memory']} "
        f"| {p['expected']} |"
        for p in rows
    ]
    return out


def render(doc: Mapping[str, Any]) -> str:
    results = doc["results"]
    gated = [r for r in results if r["run"]["expect"] != "measure"]
    ok = sum(1 for r in gated if r["met"])
    first: Mapping[str, Any] = next((r for r in results if r.get("vllm")), {})
    spec = doc.get("spec") or {}
    verdict = "PASS" if ok == len(gated) else "FAIL"
    lines = [
        f"# Offload truth: vLLM {first.get('vllm', '?')} on {first.get('device', '?')}",
        "",
        (
            f"**{verdict}: {ok} of {len(gated)} runs as expected** (clean builds PASS, planted offload bugs FAIL by "
            f"the rule they break); {len(results) - len(gated)} measured without an expectation."
        ),
        "",
        (
            f"Model: the tiny Qwen3-MoE, {spec.get('layers')} layers, hidden {spec.get('hidden')}, "
            f"{spec.get('experts')} experts, top-{spec.get('top_k')}, expert width {spec.get('moe_intermediate')}; bf16 "
            "or written pre-quantized by `moegate.model.quantize`. Each run: one offline engine (`--offload-backend "
            "uva --cpu-offload-params experts`, `--cpu-offload-gb` per the budget column), a few greedy tokens, then "
            "the CUDA driver asked where every parameter's pointer points (`moegate.offload.residency`), judged by "
            "`moegate.offload.verdict`."
        ),
        "",
        (
            f"Command: `{doc['command']}` (prepare {doc.get('prepare_s')} s, all runs side by side, "
            f"{doc.get('wall_s')} s in all)"
        ),
        "",
        (
            "MiB columns: budget asks host = the selected weights the budget puts on the host; host / device = "
            "selected weights the driver finds in host / device memory; offloader = what vLLM's offloader says it "
            "moved; pinned = pinned allocations behind the host weights / the weights' bytes."
        ),
        "",
        (
            "| run | checkpoint | MoE backend | budget | build | expected | verdict | as expected | budget asks host "
            "| host | device | offloader | pinned held / weights | finding rules |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *[_row(r) for r in results],
        "",
    ]
    for r in results:
        run = r["run"]
        lines += [f"## `{run['name']}`: {_outcome(r)}", "", run["why"] + "."]
        if r.get("verdict") is None:
            lines += ["", "```", (r.get("log_tail") or "").strip(), "```", ""]
            continue
        findings = r.get("findings") or []
        if findings:
            lines += ["", f"{len(findings)} finding(s):", ""]
            lines += [f"- {f['rule']}: {f['message']}" for f in findings[:MAX_FINDINGS]]
            if len(findings) > MAX_FINDINGS:
                lines.append(f"- ... and {len(findings) - MAX_FINDINGS} more (offload-truth.json)")
        lines += _layer0(r)
        calibration = r.get("calibration") or []
        if calibration:
            pairs = ", ".join(f"{c['request']:,} B -> {c['range_size']:,} B" for c in calibration)
            lines += ["", f"Pinned allocator, request -> allocation the driver reports: {pairs}."]
        lines.append("")
    return "\n".join(lines)
