"""The region finder: which pieces of vLLM's source the power run mutates, found by structure.

What is mutated, and only that, in groups (``GROUPS``, chosen with ``--regions``):

- ``dispatch`` (``REGIONS``, the default): the bodies of ``_weights_host_resident`` and
  ``_prepare_expert_assignment``, and at both public entrypoints the lines that compute and pass
  the residency flag and the expert count (fused shared-expert rows included: the modular
  entrypoint counts them in ``num_align_experts``);
- ``kernel`` (``KERNEL_REGIONS``): the Python side of the Triton experts' bias and activation
  paths: the bias flag and strides the launcher hands the kernel, the bias each entrypoint passes,
  the activation between the two GEMMs (legacy) and the modular experts' choice between the fused
  SiLU-and-quantize kernel and the separate activation with its clamp limit;
- ``offload`` (``OFFLOAD_REGIONS``): the loader's offload code: ``UVAOffloader``'s per-parameter
  offload (budget, selection, marker) and ``device_loading_context`` (post-processing on the device,
  then re-offload).

Regions are found by parsing vLLM's source (``ast``), never by line numbers, so a new release is
re-targeted automatically or refused with one error that names what was looked for. vLLM is text
here, never imported; its names come from ``moegate.dispatch.names``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from moegate.dispatch import names
from moegate.power.errors import TargetNotFound

FUSED_MOE = names.package_file(names.FUSED_MOE)  # model_executor/layers/fused_moe/fused_moe.py
TRITON_MOE = names.package_file(names.TRITON_MOE)
UVA_OFFLOADER = names.package_file(names.UVA_OFFLOADER_MODULE)
LOADER_UTILS = names.package_file(names.LOADER_UTILS)


@dataclass(frozen=True)
class RegionSpec:
    """A piece of vLLM's source to mutate, named by structure, never by line number.

    ``kind``:
    - ``body``: every statement of function ``scope`` after its docstring (the
      signature's defaults are left alone: both entrypoints pass every argument).
    - ``assign``: the statement(s) in ``scope`` assigning the name ``name``.
    - ``call-args``: in ``scope``'s call(s) to ``name``, the arguments that bind
      the callee's parameters ``params`` (positionally or by keyword); ``kernel[grid](...)``
      counts as a call to ``kernel``.
    - ``call``: every call to ``name`` in ``scope``, arguments included.
    - ``if-test``: the condition of each ``if`` in ``scope`` whose body calls ``name``.

    ``nested``: look inside functions defined in ``scope`` too (closures such as the
    modular entrypoint's ``_base_w13_fn``).
    """

    file: str  # relative to the vllm package directory
    scope: str  # qualified name: "func" or "Class.method"
    kind: Literal["body", "assign", "call-args", "call", "if-test"]
    why: str
    name: str = ""
    params: tuple[str, ...] = ()
    nested: bool = False

    @property
    def label(self) -> str:
        detail = {
            "body": "body",
            "assign": f"{self.name} = ...",
            "call-args": f"{self.name}({', '.join(self.params)})",
            "call": f"{self.name}(...)",
            "if-test": f"if ...: {self.name}(...)",
        }
        return f"{Path(self.file).name}::{self.scope} [{detail[self.kind]}]"


REGIONS: tuple[RegionSpec, ...] = (
    RegionSpec(FUSED_MOE, names.WEIGHTS_HOST_RESIDENT, "body", "computes residency: either weight UVA-offloaded"),
    RegionSpec(FUSED_MOE, names.PREPARE_EXPERT_ASSIGNMENT, "body", "the naive/sorted decision and both assignments"),
    RegionSpec(
        FUSED_MOE,
        names.FUSED_EXPERTS_IMPL,
        "call-args",
        "legacy entrypoint: passes the expert count and the residency flag",
        name=names.PREPARE_EXPERT_ASSIGNMENT,
        params=("global_num_experts", "weights_host_resident"),
    ),
    RegionSpec(
        TRITON_MOE,
        names.TRITON_EXPERTS_APPLY,
        "assign",
        "modular entrypoint: counts experts (w1.shape[0] unless an expert map is given)",
        name=names.NUM_ALIGN_EXPERTS,
    ),
    RegionSpec(
        TRITON_MOE,
        names.TRITON_EXPERTS_APPLY,
        "call-args",
        "modular entrypoint: passes the expert count and the residency flag",
        name=names.PREPARE_EXPERT_ASSIGNMENT,
        params=("global_num_experts", "weights_host_resident"),
    ),
)


KERNEL_REGIONS: tuple[RegionSpec, ...] = (
    RegionSpec(
        FUSED_MOE,
        names.INVOKE_TRITON_KERNEL,
        "assign",
        "bias: whether the Triton kernel adds an expert bias (HAS_BIAS)",
        name="HAS_BIAS",
    ),
    RegionSpec(
        FUSED_MOE,
        names.INVOKE_TRITON_KERNEL,
        "call-args",
        "bias: the bias pointer and its expert and N strides handed to the kernel",
        name=names.TRITON_KERNEL,
        params=("b_bias_ptr", "stride_bbe", "stride_bbn"),
    ),
    RegionSpec(
        FUSED_MOE,
        names.FUSED_EXPERTS_IMPL,
        "call-args",
        "bias: the legacy entrypoint passes each GEMM its bias",
        name=names.DISPATCH_KERNEL,
        params=("B_bias",),
    ),
    RegionSpec(
        FUSED_MOE,
        names.FUSED_EXPERTS_IMPL,
        "assign",
        "activation: the activation's output width (gated: half of w13's)",
        name="activation_out_dim",
    ),
    RegionSpec(
        FUSED_MOE,
        names.FUSED_EXPERTS_IMPL,
        "call",
        "activation: the legacy entrypoint's activation between the two GEMMs",
        name=names.APPLY_MOE_ACTIVATION,
    ),
    RegionSpec(
        TRITON_MOE,
        names.TRITON_EXPERTS_APPLY,
        "call-args",
        "bias: the modular entrypoint passes each GEMM its bias",
        name=names.INVOKE_TRITON_KERNEL,
        params=("B_bias",),
        nested=True,
    ),
    RegionSpec(
        TRITON_MOE,
        names.TRITON_EXPERTS_APPLY,
        "assign",
        "activation: the activation's output width (gated: half of w13's)",
        name="cache2_dim",
    ),
    RegionSpec(
        TRITON_MOE,
        names.TRITON_EXPERTS_APPLY,
        "if-test",
        "activation: fused SiLU-and-fp8-quantize only without a clamp limit, else the separate activation",
        name=names.SILU_AND_MUL_PER_BLOCK_QUANT,
    ),
    RegionSpec(
        TRITON_MOE,
        names.TRITON_EXPERTS_ACTIVATION,
        "body",
        "activation: SiLU with a clamp limit (swiglu_limit) or the plain activation",
    ),
)


OFFLOAD_REGIONS: tuple[RegionSpec, ...] = (
    RegionSpec(
        UVA_OFFLOADER,
        names.UVA_OFFLOAD_PARAMS,
        "body",
        "offload: per-parameter budget, cpu_offload_params selection, pinned copy, UVA view, the marker",
    ),
    RegionSpec(
        LOADER_UTILS,
        names.DEVICE_LOADING_CONTEXT,
        "body",
        "offload: post-processing on the device, then re-offload of weights that lost their marker",
    ),
)


GROUPS: dict[str, tuple[RegionSpec, ...]] = {"dispatch": REGIONS, "kernel": KERNEL_REGIONS, "offload": OFFLOAD_REGIONS}
"""Region groups by name (``--regions``): each a different part of vLLM, killed by different tiers."""


def group_specs(names_: Sequence[str]) -> tuple[RegionSpec, ...]:
    """The specs of the named groups, in order; ``ValueError`` naming an unknown group."""
    unknown = [n for n in names_ if n not in GROUPS]
    if unknown or not names_:
        raise ValueError(f"unknown region group(s) {unknown}; known: {', '.join(GROUPS)}")
    return tuple(s for n in dict.fromkeys(names_) for s in GROUPS[n])


@dataclass(frozen=True)
class Region:
    """A ``RegionSpec`` located in one release's source: lines ``first..last`` (1-based, inclusive)."""

    spec: RegionSpec
    first: int
    last: int
    anchor: int  # line of the enclosing ``def``: mutant ids count lines from here

    def contains(self, line: int) -> bool:
        return self.first <= line <= self.last


FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def find_function(tree: ast.Module, qualname: str) -> FunctionNode | None:
    """The def of ``qualname`` ("f" or "Class.method") at module/class level, else None."""
    scope: Sequence[ast.stmt] = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        kinds: tuple[type, ...] = (ast.FunctionDef, ast.AsyncFunctionDef) if last else (ast.ClassDef,)
        node = next((n for n in scope if isinstance(n, kinds) and n.name == part), None)  # type: ignore[attr-defined]
        if node is None:
            return None
        if last:
            return node  # type: ignore[return-value]
        scope = node.body  # type: ignore[attr-defined]
    return None


def _body_lines(fn: FunctionNode) -> tuple[int, int] | None:
    body = list(fn.body)
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        body = body[1:]  # the docstring: nothing to mutate
    if not body:
        return None
    return body[0].lineno, max(n.end_lineno or n.lineno for n in body)


def _own_nodes(fn: FunctionNode, nested: bool = False) -> Iterator[ast.AST]:
    """Nodes of ``fn`` outside nested defs/classes (those are other scopes), or inside nested defs too."""
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.ClassDef | ast.Lambda):
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not nested:
            continue
        stack.extend(ast.iter_child_nodes(node))


def _callee_name(call: ast.Call) -> str | None:
    func = call.func.value if isinstance(call.func, ast.Subscript) else call.func  # kernel[grid](...)
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _calls(nodes: Iterable[ast.AST], name: str) -> list[ast.Call]:
    return [n for n in nodes if isinstance(n, ast.Call) and _callee_name(n) == name]


def _positional_params(trees: Mapping[str, ast.Module], name: str) -> list[str] | None:
    """Positional parameter names of the module-level function ``name`` in any of ``trees``."""
    for tree in trees.values():
        fn = find_function(tree, name)
        if fn is not None:
            return [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    return None


def locate(spec: RegionSpec, trees: Mapping[str, ast.Module]) -> tuple[list[Region], str | None]:
    """Regions for ``spec`` in ``trees`` (file -> parsed module), or a description of what is missing."""
    tree = trees.get(spec.file)
    if tree is None:
        return [], f"file {spec.file}"
    fn = find_function(tree, spec.scope)
    if fn is None:
        return [], f"function {spec.scope} in {spec.file}"
    if spec.kind == "body":
        lines = _body_lines(fn)
        if lines is None:
            return [], f"a body (statements after the docstring) in {spec.scope} in {spec.file}"
        return [Region(spec, lines[0], lines[1], fn.lineno)], None
    if spec.kind == "assign":
        found = [
            Region(spec, n.lineno, n.end_lineno or n.lineno, fn.lineno)
            for n in _own_nodes(fn, spec.nested)
            if isinstance(n, ast.Assign | ast.AnnAssign)
            and any(
                isinstance(t, ast.Name) and t.id == spec.name
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            )
        ]
        return (
            (sorted(found, key=lambda r: r.first), None)
            if found
            else ([], f"an assignment to {spec.name} in {spec.scope} in {spec.file}")
        )
    if spec.kind == "if-test":
        tests = [
            Region(spec, n.test.lineno, n.test.end_lineno or n.test.lineno, fn.lineno)
            for n in _own_nodes(fn, spec.nested)
            if isinstance(n, ast.If) and _calls((c for s in n.body for c in ast.walk(s)), spec.name)
        ]
        return (
            (sorted(tests, key=lambda r: r.first), None)
            if tests
            else ([], f"an if whose body calls {spec.name} in {spec.scope} in {spec.file}")
        )
    calls = _calls(_own_nodes(fn, spec.nested), spec.name)
    if not calls:
        return [], f"a call to {spec.name} in {spec.scope} in {spec.file}"
    if spec.kind == "call":
        found = [Region(spec, c.lineno, c.end_lineno or c.lineno, fn.lineno) for c in calls]
        return sorted(found, key=lambda r: r.first), None
    positional = _positional_params(trees, spec.name) or []
    regions: list[Region] = []
    for call in calls:
        for param in spec.params:
            node: ast.AST | None = next((k.value for k in call.keywords if k.arg == param), None)
            if node is None and param in positional:
                idx = positional.index(param)
                plain = [a for a in call.args if not isinstance(a, ast.Starred)]
                if len(plain) == len(call.args) and idx < len(call.args):
                    node = call.args[idx]
            if node is None:
                return [], f"argument {param} in the call to {spec.name} in {spec.scope} in {spec.file}"
            regions.append(Region(spec, node.lineno, node.end_lineno or node.lineno, fn.lineno))  # type: ignore[attr-defined]
    return sorted(regions, key=lambda r: r.first), None


def _what(specs: Sequence[RegionSpec]) -> str:
    """The groups ``specs`` come from, in words: 'dispatch', 'kernel-path and offload'."""
    words = {"dispatch": "dispatch", "kernel": "kernel-path", "offload": "offload"}
    named = [words[g] for g, group in GROUPS.items() if any(s in group for s in specs)]
    return " and ".join(named) or "fused-MoE"


def find_regions(
    sources: Mapping[str, str], specs: Sequence[RegionSpec] = REGIONS, *, where: str = "vLLM"
) -> list[Region]:
    """Every region of ``specs`` in ``sources`` (file -> text); one error naming everything missing."""
    trees: dict[str, ast.Module] = {}
    for name, text in sources.items():
        try:
            trees[name] = ast.parse(text, filename=name)
        except SyntaxError as exc:
            raise TargetNotFound(f"{where}: cannot parse {name}: {exc}") from exc
    regions: list[Region] = []
    missing: list[str] = []
    for spec in specs:
        found, problem = locate(spec, trees)
        if problem:
            missing.append(problem)
        regions.extend(found)
    if missing:
        raise TargetNotFound(
            f"{where} does not contain the {_what(specs)} code moegate mutates; looked for: "
            f"{'; '.join(dict.fromkeys(missing))}"
        )
    return regions
