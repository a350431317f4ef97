"""Every configuration the census found in vLLM's MoE layers is one the case strategies draw.

The census golden of the newest reviewed release (``golden/census/``) lists what vLLM's
model classes build (activations with their clamp limits, biases, fused shared
experts, router weight on the input) and the shapes it serves (from its tuned-config
file names and the models' config defaults). The strategies declare their space in
``moegate.strategies.space`` and build every draw from it; this test holds
the census to that space, and proves with Hypothesis's ``find`` that ``moe_cases``
really draws each joint configuration and each end of each range. A census entry
outside the space fails here until the strategies (and the case model, the
reference and the adapter behind them) are extended to it.

"Really draws" is shown on draws: ``DRAWS`` examples of ``moe_cases`` generated once
by Hypothesis (derandomized, generation only: a search per requirement with
``hypothesis.find`` shrinks every hit and took minutes), and every requirement must
be met by one of them.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable
from typing import Any

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from moegate.census import census
from moegate.census.syntax import is_expr
from moegate.core.case import DTYPES, MoECase
from moegate.strategies import moe, space
from moegate.strategies.moe import moe_cases

DRAWS = 800
ANY = moe_cases(expert_map=None, quant=None, shared=None, activation=None, bias=None, wide=True)
QUANTIZED = moe_cases(quant=True, expert_map=None, wide=True, bias=None)


@functools.cache
def drawn(strategy: st.SearchStrategy[MoECase]) -> tuple[MoECase, ...]:
    """``DRAWS`` cases as Hypothesis generates them for ``strategy`` (the same ones on every run)."""
    out: list[MoECase] = []

    @settings(
        max_examples=DRAWS,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(case=strategy)
    def collect(case: MoECase) -> None:
        out.append(case)

    collect()
    return tuple(out)


def find(strategy: st.SearchStrategy[MoECase], pred: Callable[[MoECase], bool], what: str) -> None:
    """Among the fixed draws, else by Hypothesis's own search (a rare joint case: the draws' order depends on the
    strategies' state earlier tests left, so a case 1 in 800 of them held can be missing from a full run's)."""
    if any(pred(c) for c in drawn(strategy)):
        return
    try:
        hypothesis.find(strategy, pred, settings=settings(database=None, max_examples=4000, derandomize=True))
    except hypothesis.errors.NoSuchExample:
        pytest.fail(f"moe_cases never drew {what} in {len(drawn(strategy))} examples nor in a search of 4,000")


TUNED_SCHEME = {None: None, "fp8_w8a8": "fp8_w8a8", "int8_w8a16": "int8_w8a16", "int4_w4a16": "int4_w4a16"}
"""A tuned config's dtype (as vLLM's lookup names it) -> the case's quantization scheme."""


@functools.cache
def records() -> list[dict[str, Any]]:
    goldens = census.committed()
    if not goldens:
        pytest.fail("no census golden under golden/census/: run `python -m moegate.census --bless`")
    return census.parse_golden(next(reversed(goldens.values())).read_text())


def of(kind: str) -> list[dict[str, Any]]:
    return [r for r in records() if r["kind"] == kind]


def _literal_values(layer: dict[str, Any], param: str, group: str) -> list[Any]:
    """What the census pins a layer argument to: its literal, else the values its config classes give."""
    given = layer[group].get(param)
    if given is not None and not is_expr(given):
        return [given]
    pinned = layer["values"].get(param, {})
    out: list[Any] = []
    for v in pinned.values():
        out += v if isinstance(v, list) else [v]
    return out


def accepted_activations() -> set[str]:
    return {r["name"] for r in of("activation") if r["triton"]}


def layer_requirements(layer: dict[str, Any]) -> dict[str, Any]:
    """What a layer needs drawn: its activations (all accepted ones when an expression no config pins), clamp, bias..."""
    acts = set(_literal_values(layer, "activation", "activation")) or accepted_activations()
    bias = layer["bias"].get("has_bias")
    on_input = layer["routing"].get("apply_router_weight_on_input")
    fused = layer["shared"].get("n_shared_experts") not in (None, "=None")
    return {
        "activations": acts,
        "clamped": "swiglu_limit" in layer["activation"],
        "bias": True if bias is True else None if is_expr(bias) else False,
        "shared": fused,
        "on_input": True if on_input is True else None if is_expr(on_input) else False,
    }


def test_the_census_holds_what_it_is_checked_for():
    """The control: the golden this test reads has layers, shapes, tuned configs and activations to hold."""
    assert len(of("layer")) > 20 and len(of("shape")) > 10 and len(of("tuned")) > 100 and of("activation")


def test_every_activation_vllms_triton_experts_accept_is_in_the_space():
    missing = accepted_activations() - set(space.ACTIVATIONS)
    assert not missing, f"activations vLLM accepts that the strategies cannot draw: {sorted(missing)}"


def pinned_problems(layers: list[dict[str, Any]]) -> list[str]:
    problems = []
    for layer in layers:
        where = f"{layer['file']}::{layer['scope']}"
        for act in _literal_values(layer, "activation", "activation"):
            if act not in space.ACTIVATIONS:
                problems.append(f"{where}: activation {act!r}")
        for limit in _literal_values(layer, "swiglu_limit", "activation"):
            if limit not in space.LIMITS:
                problems.append(f"{where}: clamp limit {limit}")
        for shared in _literal_values(layer, "n_shared_experts", "shared"):
            if shared not in space.SHARED:
                problems.append(f"{where}: {shared} fused shared experts")
        for k in _literal_values(layer, "top_k", "shape"):
            if k not in space.TOP_K:
                problems.append(f"{where}: top-{k}")
    return problems


def test_every_pinned_layer_value_is_in_the_space():
    problems = pinned_problems(of("layer"))
    assert not problems, "census values outside the strategies' space:\n" + "\n".join(problems)


def shape_problems(shapes: list[dict[str, Any]]) -> list[str]:
    problems = []
    for shape in shapes:
        where = f"{shape['config']} at TP{shape['tp']}"
        checks = [
            ("experts", shape["experts"], space.EXPERTS),
            ("hidden", shape["hidden"], space.HIDDEN),
            ("intermediate N", shape["N"], space.INTERMEDIATE),
            ("top-k", shape["top_k"], space.TOP_K),
        ]
        problems += [f"{where}: {what} {v}" for what, v, rng in checks if v is not None and v not in rng]
        if shape["shared"] not in space.SHARED:
            problems.append(f"{where}: {shape['shared']} fused shared experts")
    return problems


def test_every_served_shape_is_in_the_space():
    problems = shape_problems(of("shape"))
    assert not problems, "served shapes outside the strategies' space:\n" + "\n".join(problems)


def test_a_census_entry_outside_the_space_is_reported():
    """The control: the checks above do fail on an activation, a limit, a top-k or a shape the space lacks."""
    layer = json.loads(json.dumps(of("layer")[0]))
    layer["activation"] = {"activation": "quick_gelu", "swiglu_limit": 3.5}
    layer["shape"]["top_k"] = 40
    assert len(pinned_problems([layer])) == 3
    shape = dict(of("shape")[0], hidden=65536, N=3, shared=4)
    assert len(shape_problems([shape])) == 3


def test_every_tuned_config_vllm_looks_up_is_in_the_space():
    problems = []
    for t in of("tuned"):
        if not t.get("lookup"):
            continue  # a file vLLM's Triton lookup never opens (the census says which)
        where = json.dumps({k: t[k] for k in ("experts", "n", "dtype", "block_shape")})
        if t["dtype"] == "float32":
            if "float32" not in DTYPES:
                problems.append(f"{where}: float32")
        elif t["dtype"] not in TUNED_SCHEME or TUNED_SCHEME[t["dtype"]] not in space.SCHEMES:
            problems.append(f"{where}: dtype {t['dtype']}")
        block = t["block_shape"]
        if block is not None and (block[0] != block[1] or block[1] not in space.FP8_GROUPS):
            problems.append(f"{where}: block {block}")
        if t["n"] not in space.INTERMEDIATE or t["experts"] > space.EXPERTS.hi + max(space.SHARED):
            problems.append(f"{where}: shape")
    assert not problems, "tuned configs vLLM looks up that the strategies cannot draw:\n" + "\n".join(problems)


def _joint(req: dict[str, Any]) -> list[Callable[[MoECase], bool]]:
    """One predicate per activation the layer may run, each with the rest of its requirements."""

    def pred(c: MoECase, act: str) -> bool:
        return (
            c.activation.name == act
            and (not req["clamped"] or act != "silu" or c.activation.limit is not None)
            and (req["bias"] is None or c.bias == req["bias"])
            and (not req["shared"] or c.shared_experts > 0)
            and (req["on_input"] is None or c.apply_router_weight_on_input == req["on_input"])
        )

    return [functools.partial(pred, act=act) for act in sorted(req["activations"])]


def _joint_requirements() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for layer in of("layer"):
        req = layer_requirements(layer)
        key = json.dumps({k: sorted(v) if isinstance(v, set) else v for k, v in req.items()}, sort_keys=True)
        out.setdefault(key, req)
    return out


@pytest.mark.parametrize("key", sorted(_joint_requirements()) if census.committed() else [])
def test_moe_cases_draws_each_layer_configuration_of_the_census(key):
    """``find`` a case with the layer's activation, clamp, bias, fused shared experts and router-weight placement."""
    for pred in _joint(_joint_requirements()[key]):
        find(ANY, pred, key)


@pytest.mark.parametrize(
    "what,strategy,rng",
    [
        ("experts", moe._EXPERTS, space.EXPERTS),
        ("top_k", moe._TOP_K_WIDE, space.TOP_K),
        ("hidden", moe._HIDDEN_WIDE, space.HIDDEN),
        ("intermediate", moe._INTER_WIDE, space.INTERMEDIATE),
    ],
)
def test_the_strategy_moe_cases_draws_each_dimension_from_reaches_both_ends_of_its_range(what, strategy, rng):
    """Each shape dimension's own strategy (the object ``moe_cases(wide=True)`` draws from) spans its declared range.

    Searched with ``hypothesis.find`` on that one strategy: an exact end is rare among whole
    cases, instant for a search over one integer.
    """
    for end in (rng.lo, rng.hi):
        hypothesis.find(
            strategy, functools.partial(operator.eq, end), settings=settings(database=None, max_examples=2000)
        )
    with pytest.raises(hypothesis.errors.NoSuchExample):  # and never leaves it
        hypothesis.find(strategy, lambda v: v not in rng, settings=settings(database=None, max_examples=300))


def test_a_wide_case_draws_its_shape_from_those_strategies():
    """The control for the test above: wide cases spread over the ranges (not pinned to a corner of them)."""
    cases = drawn(ANY)
    for values, rng in (
        ({c.hidden for c in cases}, space.HIDDEN),
        ({c.intermediate for c in cases}, space.INTERMEDIATE),
    ):
        assert min(values) < rng.lo + 128 and max(values) > rng.hi // 2, (min(values), max(values))
        assert any(v % 128 for v in values), "no value off the multiples of 128"


def _quantized(case: MoECase, scheme: str | None = None, group: int | None = None, bias: bool | None = None) -> bool:
    q = case.quant
    return (
        q is not None
        and (scheme is None or q.scheme == scheme or (scheme == "wNa16" and q.weight_only))
        and (group is None or q.group_size == group)
        and (bias is None or case.bias == bias)
    )


def test_moe_cases_draws_every_declared_quantization_block_and_biased_quantization():
    for scheme in [s for s in space.SCHEMES if s is not None]:
        find(QUANTIZED, functools.partial(_quantized, scheme=scheme), f"scheme {scheme}")
    for g in space.FP8_GROUPS:
        find(QUANTIZED, functools.partial(_quantized, scheme="fp8_w8a8", group=g), f"fp8 block {g}")
    for g in space.WNA16_GROUPS:
        find(QUANTIZED, functools.partial(_quantized, scheme="wNa16", group=g), f"wNa16 group {g}")
    for scheme in ("fp8_w8a8", "int8_w8a16"):
        find(QUANTIZED, functools.partial(_quantized, scheme=scheme, bias=True), f"biased {scheme}")
