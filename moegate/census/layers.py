"""Every model class that builds a fused-MoE layer, and what it asks the builder for.

One record per builder call: the file, the scope it is called from (the model's MoE
block, ``Class.method``), and the arguments, grouped by what they decide:

- ``shape``: experts, top-k, hidden, expert intermediate (and its padding);
- ``activation``: the activation and its parameters (a SwiGLU clamp limit, alpha, beta, SiTU's betas);
- ``bias``: whether the experts carry biases (``has_bias``);
- ``shared``: a separate shared-experts module, and shared experts fused into the routed ones
  (``n_shared_experts`` with ``fuse_shared_experts``: extra rows of w13/w2 and extra ids per token);
- ``quant``: the quantization config handed over (``None`` means the layer is built unquantized);
- ``routing``: renormalise, scoring function, grouped top-k, score-correction bias, router weight on
  the input, routed scaling, custom routing;
- ``ep``: expert-parallel load balancing (every builder call supports plain expert parallelism);
- ``custom``: a model's own routed-experts or runner class;
- ``other``: every other argument, so any change to a call shows in the census.

An argument the call does not pass is the builder's default for the groups that
decide dispatch or numerics (``DEFAULTED``). Values are literals or ``"=<source>"``;
``values`` holds what the model's config classes pin the expressions to
(``moegate.census.configs``). ``**kwargs`` built from a dict literal in the same
function are read as keywords.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from moegate.census.archs import Architectures
from moegate.census.builders import Builder
from moegate.census.configs import ConfigIndex, Resolver
from moegate.census.source import VllmSource
from moegate.census.syntax import ScopedCall, callee, parse, read, scoped_calls, value

GROUPS: dict[str, tuple[str, ...]] = {
    "shape": ("num_experts", "top_k", "hidden_size", "intermediate_size", "intermediate_pad"),
    "activation": (
        "activation",
        "swiglu_limit",
        "swiglu_alpha",
        "swiglu_beta",
        "activation_situ_beta",
        "activation_situ_linear_beta",
    ),
    "bias": ("has_bias",),
    "shared": ("shared_experts", "n_shared_experts", "fuse_shared_experts", "shared_expert_gate"),
    "quant": ("quant_config",),
    "routing": (
        "renormalize",
        "scoring_func",
        "use_grouped_topk",
        "num_expert_group",
        "topk_group",
        "e_score_correction_bias",
        "apply_router_weight_on_input",
        "routed_scaling_factor",
        "apply_routed_scale_to_output",
        "custom_routing_function",
        "router",
        "zero_expert_type",
        "hash_indices_table",
    ),
    "ep": ("enable_eplb", "num_redundant_experts"),
    "custom": ("routed_experts_cls", "runner_cls", "moe_config_cls", "routed_experts_args", "runner_args"),
}
DEFAULTED = (
    "activation",
    "has_bias",
    "quant_config",
    "renormalize",
    "scoring_func",
    "use_grouped_topk",
    "apply_router_weight_on_input",
    "enable_eplb",
)
"""Parameters recorded with the builder's default when a call leaves them out."""

IGNORED = frozenset({"prefix"})
"""Arguments that name, not configure (the weight prefix)."""

RESOLVED = (
    "num_experts",
    "top_k",
    "hidden_size",
    "intermediate_size",
    "n_shared_experts",
    "activation",
    "swiglu_limit",
)
"""Arguments whose config-class values the census looks up."""


def _star_keywords(sc: ScopedCall, name: str) -> dict[str, ast.AST] | None:
    """Keywords of ``**name`` when ``name`` is a dict literal (or ``dict(...)``) assigned in the same function."""
    if sc.function is None:
        return None
    found: dict[str, ast.AST] | None = None
    for stmt in ast.walk(sc.function):
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
            v = stmt.value
            if isinstance(v, ast.Dict) and all(isinstance(k, ast.Constant) for k in v.keys):
                found = {
                    k.value: x
                    for k, x in zip(v.keys, v.values)
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                }
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "dict" and not v.args:
                found = {kw.arg: kw.value for kw in v.keywords if kw.arg}
    return found


def _record(src: VllmSource, file: Path, sc: ScopedCall, builder: Builder, resolver: Resolver) -> dict[str, Any]:
    passed: dict[str, ast.AST] = {}
    star: list[str] = []
    for name, node in zip(builder.params, [a for a in sc.call.args if not isinstance(a, ast.Starred)]):
        passed[name] = node
    for kw in sc.call.keywords:
        if kw.arg is not None:
            passed[kw.arg] = kw.value
        elif isinstance(kw.value, ast.Name) and (more := _star_keywords(sc, kw.value.id)) is not None:
            passed.update({k: v for k, v in more.items() if k not in passed})
        else:
            star.append("**" + ast.unparse(kw.value))
    rec: dict[str, Any] = {"kind": "layer", "file": src.rel(file), "scope": sc.scope, "builder": builder.name}
    grouped = {p for g in GROUPS.values() for p in g}
    for group, params in GROUPS.items():
        entry = {p: value(passed[p]) for p in params if p in passed}
        entry.update({p: builder.default(p) for p in params if p not in passed and p in DEFAULTED})
        rec[group] = entry
    rec["other"] = {p: value(n) for p, n in passed.items() if p not in grouped and p not in IGNORED}
    if star:
        rec["unread"] = star
    values = {}
    for p in RESOLVED:
        if p in passed and isinstance(value(passed[p]), str) and str(value(passed[p])).startswith("="):
            v = resolver.values(sc, passed[p])
            if v is not None:
                values[p] = v
    rec["values"] = values
    rec["config_classes"] = resolver.classes
    return rec


def find_layers(
    src: VllmSource, builders: list[Builder], files: list[Path], index: ConfigIndex, archs: Architectures
) -> list[dict[str, Any]]:
    """One record per builder call in ``files`` (the builders' own definitions excluded)."""
    by_name = {b.name: b for b in builders}
    names = frozenset(by_name)
    defining = {src.path(b.file) for b in builders}
    records: list[dict[str, Any]] = []
    for file in files:
        text = read(file)
        if not any(n in text for n in names):
            continue
        tree = parse(file)
        calls = [sc for sc in scoped_calls(tree, names) if not (file in defining and sc.scope.split(".")[0] in names)]
        if not calls:
            continue
        resolver = Resolver(index, tree, archs.config_classes(src.rel(file)))
        seen: dict[str, int] = {}
        for sc in calls:
            name = callee(sc.call) or ""
            rec = _record(src, file, sc, by_name[name], resolver)
            seen[sc.scope] = seen.get(sc.scope, 0) + 1
            if seen[sc.scope] > 1:
                rec["scope"] = f"{sc.scope}#{seen[sc.scope]}"
            records.append(rec)
    return records
