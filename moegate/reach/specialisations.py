"""Which variants of vLLM's Triton kernels a run compiled: the compile-time arguments that change what a kernel does.

Triton compiles a ``@triton.jit`` kernel once per *specialisation*: the values of its ``tl.constexpr``
parameters, the element types of its pointers, and the attributes it derives from the other
arguments (an integer or a pointer divisible by 16 gets ``tt.divisibility = 16``; an integer equal to
1 becomes a constant). Each new specialisation in a process goes through Triton 3.6's
``triton.knobs.runtime.jit_cache_hook`` before it is compiled (``JITFunction._do_compile``), with the
``signature`` (parameter -> type), the ``constants`` (argument path -> value) and the ``configs``
(argument path -> attributes) it is keyed by. ``record`` installs a hook there (chained to any hook
already set, whose answer it returns: the hook can veto a compilation, this one never does) and
notes each as ``Specialisation``.

What is kept: the constexprs that select behaviour (quantization flags, ``HAS_BIAS``,
``MUL_ROUTED_WEIGHT``, ``naive_block_assignment``, the compute type, the block-quantization group),
pointer element types, the parameters divisible by 16, and those specialised to 1. What is left out:
pure tuning (``TUNING``: tile sizes, warps, stages), which change the schedule, not the result a
correct kernel computes. A kernel variant compiled once in the process is every launch of it: a
variant already compiled is not seen again, so the record is the set of variants, not a count of
launches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TUNING = frozenset({"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "SPLIT_K", "BLOCK_M", "BLOCK_N",
                    "BLOCK_K", "BLOCK_SIZE", "num_warps", "num_stages", "num_ctas"})  # fmt: skip
"""Constexpr names that only tune the schedule (tile sizes, pipeline depth), left out of a specialisation."""


@dataclass(frozen=True)
class Specialisation:
    """One compiled variant of a Triton kernel, by what changes its behaviour."""

    kernel: str  # FILE::QUALNAME, the file relative to the vllm folder (or the module, outside vLLM)
    flags: tuple[tuple[str, Any], ...]  # behaviour-selecting constexprs, by parameter name
    types: tuple[tuple[str, str], ...]  # pointer parameters' element types
    divisible: tuple[str, ...]  # parameters Triton specialised as divisible by 16
    ones: tuple[str, ...] = field(default=())  # integer parameters specialised as equal to 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "flags": dict(self.flags),
            "types": dict(self.types),
            "divisible": list(self.divisible),
            "ones": list(self.ones),
        }


def _value(value: Any) -> Any:
    """A JSON-able form of a constexpr's value (Triton dtypes by name, ``tl.constexpr`` unwrapped)."""
    if value.__class__.__name__ == "constexpr":
        value = getattr(value, "value", value)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _kernel_name(jit_function: Any, name: str, vllm_root: Path | None) -> str:
    code = getattr(getattr(jit_function, "fn", None), "__code__", None)
    qual = getattr(getattr(jit_function, "fn", None), "__qualname__", name)
    if code is not None and vllm_root is not None:
        for file, root in (
            (Path(code.co_filename), vllm_root),
            (Path(code.co_filename).resolve(), vllm_root.resolve()),
        ):
            with contextlib.suppress(ValueError):
                return f"{file.relative_to(root).as_posix()}::{qual}"
    module = getattr(jit_function, "module", None) or "?"
    if module.startswith("vllm."):  # a build whose vllm folder links its files elsewhere (the corpus's mirrors)
        return f"{module.removeprefix('vllm.').replace('.', '/')}.py::{qual}"
    return f"{module}::{qual}"


def specialisation(fn: Any, compile: dict[str, Any], vllm_root: Path | None = None) -> Specialisation:
    """The ``Specialisation`` of one ``jit_cache_hook`` call's ``fn`` (JitFunctionInfo) and ``compile`` arguments."""
    jit = fn.jit_function
    params = list(getattr(jit, "params", []))
    names = [getattr(p, "name", str(i)) for i, p in enumerate(params)]
    constexpr = {getattr(p, "name", "") for p in params if getattr(p, "is_constexpr", False)}

    def name_of(path: Any) -> str:
        index = path[0] if isinstance(path, tuple) and path else path
        return names[index] if isinstance(index, int) and index < len(names) else str(path)

    flags, ones = {}, []
    for path, value in (compile.get("constants") or {}).items():
        name = name_of(path)
        if name in constexpr:
            if name not in TUNING:
                flags[name] = _value(value)
        elif value == 1:
            ones.append(name)
    signature = compile.get("signature") or {}
    types = {k: str(v) for k, v in signature.items() if isinstance(v, str) and v.startswith("*")}
    attrs = (compile.get("configs") or [{}])[0] or {}
    divisible = sorted(
        name_of(path) for path, attr in attrs.items() if any(a and a[0] == "tt.divisibility" for a in attr)
    )
    return Specialisation(
        _kernel_name(jit, getattr(fn, "name", "?"), vllm_root),
        tuple(sorted(flags.items())),
        tuple(sorted(types.items())),
        tuple(divisible),
        tuple(sorted(ones)),
    )


@contextlib.contextmanager
def record(
    into: list[Specialisation], vllm_root: Path | None = None, errors: list[str] | None = None
) -> Iterator[bool]:
    """While open, append to ``into`` every Triton kernel variant this process compiles; yields False without Triton.

    A variant whose arguments cannot be read is not allowed to stop the kernel: its error goes to ``errors``
    (the report says how many), and compilation goes on."""
    try:
        from triton import knobs  # Triton 3.4+: the runtime's hooks live in triton.knobs
    except ImportError:
        yield False
        return
    previous = knobs.runtime.jit_cache_hook

    def hook(*args: Any, **kwargs: Any) -> Any:
        try:
            into.append(specialisation(kwargs["fn"], kwargs["compile"], vllm_root))
        except Exception as exc:  # noqa: BLE001 - see the docstring: noted, never raised into Triton
            if errors is not None:
                errors.append(f"{type(exc).__name__}: {exc}")
        return previous(*args, **kwargs) if previous is not None else False

    knobs.runtime.jit_cache_hook = hook
    try:
        yield True
    finally:
        knobs.runtime.jit_cache_hook = previous
