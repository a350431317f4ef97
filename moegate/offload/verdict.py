"""Offload truth: every weight is where its UVA marker and the offload budget say, by the CUDA driver's word.

The dispatch rule under test trusts one attribute: a weight carrying ``_vllm_is_uva_offloaded``
is taken to live in host memory. ``judge`` checks the claim against what
``moegate.offload.residency.observe`` read from the driver after vLLM loaded a model with
``--offload-backend uva --cpu-offload-gb G --cpu-offload-params SEGMENTS``. Pure data in, a
verdict out (no torch, no vLLM), so every rule is unit-tested on synthetic observations.

Rules, each finding naming the layer, the parameter and where it actually lives:

- ``marked-not-host``: a marked weight whose memory is not host memory (post-processing put it
  back on the device, or the offload never happened while the marker was set);
- ``host-not-marked``: host memory without the marker (the dispatch rule would treat a
  PCIe-bound weight as device memory);
- ``not-cuda-memory``: memory the driver does not know (pageable host memory a kernel must not read);
- ``budget``: the selected weights in host memory are not the ones the budget asks for. vLLM's
  offloader walks the decoder layers in order and each layer's parameters in registration order,
  skips those ``SEGMENTS`` do not select, and offloads a parameter while the bytes offloaded so far
  are below the budget (``>=`` stops it), whole parameters only: so the expected set is a prefix of
  the selected parameters, and with a budget above their total it is all of them (``expected_host``).
  The replay uses the parameters as they are after loading: for a budget that cuts mid-way it
  assumes post-processing kept their order and sizes (true of the unquantized layer);
- ``accounting``: vLLM's offloader says it moved a number of bytes to the host that differs from
  the bytes of selected weights in host memory (work done, then undone);
- ``pinned``: a pinned allocation holds more than the allocator's rounding explains. torch's
  caching host allocator rounds every request up to a power of two and allocates exactly that
  (``cudaHostAlloc``), and the driver rounds small allocations up to its own minimum: so an
  allocation backing ``n`` bytes of weights may be ``max(pow2ceil(n), min_block)`` bytes and no
  more, with ``min_block`` measured in the same process (``calibrate_pinned``: the largest
  allocation behind a request of at most one page; 4,096 B when not measured).

The verdict is PASS when there is no finding, else FAIL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

PAGE = 4096
GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Budget:
    """What the loader was asked: ``cpu_offload_gb`` in bytes as vLLM computes it, and ``cpu_offload_params``."""

    max_bytes: int
    segments: tuple[str, ...]

    @classmethod
    def from_gb(cls, gb: float, segments: Iterable[str]) -> Budget:
        return cls(int(gb * 1024**3), tuple(sorted(segments)))

    @property
    def label(self) -> str:
        return f"{self.max_bytes / GIB:g} GiB of {', '.join(self.segments) or 'any parameter'}"


@dataclasses.dataclass(frozen=True)
class Finding:
    rule: str
    param: str
    layer: int | None
    message: str


@dataclasses.dataclass(frozen=True)
class Verdict:
    passed: bool
    findings: list[Finding]
    figures: dict[str, Any]  # bytes asked / held / accounted, pinned rounding
    layers: dict[int, list[dict[str, Any]]]  # per decoder layer: its selected parameters, marker, memory, bytes

    @property
    def label(self) -> str:
        return "PASS" if self.passed else "FAIL"


def where(p: Mapping[str, Any]) -> str:
    """Where a parameter lives, in words: 'host memory', 'device memory (GPU 0)', ..."""
    memory = p["memory"]
    if memory == "device":
        return f"device memory (GPU {p['gpu']})" if p.get("gpu") is not None else "device memory"
    if memory == "host":
        return "host memory (pinned, mapped for the GPU)"
    if memory == "unregistered":
        return "memory CUDA does not know (pageable host memory?)"
    return f"{memory} memory"


def describe(p: Mapping[str, Any]) -> str:
    """'layer 3 model.layers.3.mlp.experts.w13_weight' (the layer first: findings sort by it)."""
    layer = p.get("layer")
    return f"{'layer ' + str(layer) + ' ' if layer is not None else ''}{p['name']}"


def expected_host(params: Sequence[Mapping[str, Any]], budget: Budget) -> set[str]:
    """The selected parameters vLLM's offloader puts on the host under ``budget`` (the module docstring's replay)."""
    done, out = 0, set()
    for p in params:
        if not p["selected"]:
            continue
        if done >= budget.max_bytes:
            break
        out.add(p["name"])
        done += int(p["nbytes"])
    return out


def pow2ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def min_block(calibration: Sequence[Mapping[str, Any]] | None) -> int:
    """The driver's smallest pinned allocation, from the calibration (requests of at most a page); else a page."""
    small = [int(c["range_size"]) for c in calibration or () if int(c["request"]) <= PAGE and c.get("range_size")]
    return max(small) if small else PAGE


def pinned_allowance(n: int, block: int) -> int:
    """The largest allocation torch's pinned allocator and the driver may make for ``n`` bytes."""
    return max(pow2ceil(n), block)


def _pinned(params: Sequence[Mapping[str, Any]], block: int) -> tuple[dict[str, Any], list[Finding]]:
    """Pinned allocations behind the host-resident parameters, their rounding, and findings beyond the allowance."""
    allocations: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    unknown = 0
    for p in params:
        if p["memory"] != "host":
            continue
        if not p.get("range_size"):
            unknown += int(p["nbytes"])
            continue
        allocations.setdefault((int(p["range_start"]), int(p["range_size"])), []).append(p)
    findings = []
    held = weights = 0
    for (_, size), inside in sorted(allocations.items()):
        n = sum(int(p["nbytes"]) for p in inside)
        held += size
        weights += n
        allowed = pinned_allowance(n, block)
        if size > allowed:
            first = inside[0]
            findings.append(
                Finding(
                    "pinned",
                    first["name"],
                    first.get("layer"),
                    f"{describe(first)}: its pinned allocation is {size:,} B for {n:,} B of weights, above the "
                    f"{allowed:,} B that rounding to a power of two (min {block:,} B) explains",
                )
            )
    figures = {
        "allocations": len(allocations),
        "weight_bytes": weights,
        "held_bytes": held,
        "overhead_ratio": round(held / weights, 6) if weights else None,
        "unknown_range_bytes": unknown,
        "min_block": block,
    }
    return figures, findings


def judge(
    observation: Mapping[str, Any], budget: Budget, calibration: Sequence[Mapping[str, Any]] | None = None
) -> Verdict:
    """The verdict on one loaded model (see the module docstring for the rules)."""
    params = observation["params"]
    findings: list[Finding] = []

    def add(rule: str, p: Mapping[str, Any], what: str) -> None:
        findings.append(Finding(rule, p["name"], p.get("layer"), f"{describe(p)}: {what}"))

    for p in params:
        if p["memory"] == "empty":
            continue
        if p["marked"] and p["memory"] != "host":
            add("marked-not-host", p, f"marked host-resident (_vllm_is_uva_offloaded) but lives in {where(p)}")
        elif not p["marked"] and p["memory"] == "host":
            add(
                "host-not-marked", p, f"lives in {where(p)} without the UVA marker: dispatch takes it for device memory"
            )
        if p["memory"] not in ("host", "device"):
            add("not-cuda-memory", p, f"lives in {where(p)}")

    want = expected_host(params, budget)
    for p in params:
        host = p["memory"] == "host"
        if p["name"] in want and not host:
            add("budget", p, f"the budget ({budget.label}) asks for it on the host; it lives in {where(p)}")
        elif p["name"] not in want and host:
            why = "beyond the budget" if p["selected"] else "not selected by cpu_offload_params"
            add("budget", p, f"{why} ({budget.label}), yet it lives in {where(p)}")

    selected = [p for p in params if p["selected"]]
    host_bytes = sum(int(p["nbytes"]) for p in selected if p["memory"] == "host")
    device_bytes = sum(int(p["nbytes"]) for p in selected if p["memory"] == "device")
    want_bytes = sum(int(p["nbytes"]) for p in selected if p["name"] in want)
    offloader = observation.get("offloader") or {}
    accounted = offloader.get("cpu_offload_bytes")
    if accounted is not None and int(accounted) != host_bytes:
        findings.append(
            Finding(
                "accounting",
                "*",
                None,
                f"vLLM's {offloader.get('class')} accounted {int(accounted):,} B to the host; "
                f"{host_bytes:,} B of the selected weights live in host memory",
            )
        )
    block = min_block(calibration)
    pinned, pinned_findings = _pinned(params, block)
    findings += pinned_findings

    layers: dict[int, list[dict[str, Any]]] = {}
    for p in selected:
        layers.setdefault(int(p["layer"]), []).append(
            {
                "param": p["name"].rsplit(".", 1)[-1],
                "name": p["name"],
                "marked": p["marked"],
                "memory": p["memory"],
                "expected": "host" if p["name"] in want else "device",
                "nbytes": int(p["nbytes"]),
                "dtype": p.get("dtype"),
            }
        )
    figures = {
        "budget_bytes": budget.max_bytes,
        "segments": list(budget.segments),
        "selected_bytes": sum(int(p["nbytes"]) for p in selected),
        "expected_host_bytes": want_bytes,
        "host_bytes": host_bytes,
        "device_bytes": device_bytes,
        "offloader_accounted_bytes": accounted,
        "offloader": offloader.get("class"),
        "pinned": pinned,
        "marked": sum(1 for p in params if p["marked"]),
        "params": len(params),
    }
    findings.sort(key=lambda f: (f.layer if f.layer is not None else -1, f.param, f.rule))
    return Verdict(not findings, findings, figures, layers)


def to_json(v: Verdict) -> dict[str, Any]:
    return {
        "verdict": v.label,
        "findings": [dataclasses.asdict(f) for f in v.findings],
        "figures": v.figures,
        "layers": {str(k): rows for k, rows in sorted(v.layers.items())},
    }
