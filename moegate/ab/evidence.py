"""Evidence beside the verdict: expert bytes per decode step and the PCIe bandwidth they imply.

Per concurrency ``c`` (every request in flight decodes in the same step, so a decode step
carries ``c`` tokens; prefill steps are ignored):

- **pairs** per step per MoE layer: ``c * top_k``; the naive path reads an expert once
  per pair.
- **unique experts** per step per MoE layer: the sorted path reads each routed expert once
  (``moegate/kernels/traffic.py``: one row block per expert for ``c * top_k <= BLOCK_SIZE_M``).
  Modelled under uniform routing as ``E * (1 - (1 - k/E)^c)`` (each token picks ``k`` of
  ``E`` experts without replacement, tokens independent), or measured from a routing
  sample (per concurrency, a list of steps, each a list of per-token top-k ids) through
  ``traffic.naive_blocks`` / ``sorted_blocks``.
- **path** per build: host-resident weights take the sorted path on a build with the
  rule of vLLM PR #62054 (0.33.0+), and the naive path on one without it whenever
  ``c * top_k * 4 <= E`` (the naive region; ``docs/spec.md``).
- **bytes per step** = reads x per-expert bytes (w13 + w2) x MoE layers x the fraction of
  experts on the host (1.0 when all are offloaded; under uniform routing a partial
  offload scales the host bytes by that fraction).
- **byte bound** = the base's bytes per step over the PR's, less 1: the decode speed-up if a step were
  nothing but expert reads over PCIe.
- **achieved bandwidth** = bytes per step x steps/s, with steps/s ~ output tok/s / c. Set
  against the UVA read bandwidth of the machine the run served on, it shows whether a build's decode
  is at the PCIe limit: at the peak, saving bytes is the only way to go faster. That bandwidth comes from
  the runner's preflight (``--preflight FILE``: ``moegate preflight --json FILE``'s ``uva_read_gbps``,
  the contract in issue 28), or ``--uva-peak-gbps``; without either, the H200's 51 GB/s
  (``results/ab-h200.md``), which the report then says loudly is not this machine's.

No vLLM and no torch import, unless a routing sample is given (then ``moegate.kernels.traffic``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from moegate.core.case import MoECase
from moegate.core.spec import in_naive_region

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "int8": 1}
DEFAULT_UVA_PEAK_GBPS = 51.0
DEFAULT_PEAK_SOURCE = (
    "NOT MEASURED ON THIS MACHINE: the default, the H200's in-place read of pinned memory (results/ab-h200.md); "
    "give --preflight FILE (moegate preflight --json) or --uva-peak-gbps"
)


def uva_peak(preflight: str | Path | None, given: float | None) -> tuple[float, str]:
    """(GB/s, where it came from) for the evidence columns: the preflight file's ``uva_read_gbps``, else the
    figure given, else the default with a loud source line. ValueError (one line) on a bad file or both given."""
    if preflight is not None and given is not None:
        raise ValueError("give --preflight FILE or --uva-peak-gbps, not both")
    if given is not None:
        if not (math.isfinite(given) and given > 0):
            raise ValueError(f"--uva-peak-gbps {given}: must be a positive number")
        return given, "given on the command line (--uva-peak-gbps)"
    if preflight is None:
        return DEFAULT_UVA_PEAK_GBPS, DEFAULT_PEAK_SOURCE
    path = Path(preflight)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--preflight {path}: not a readable JSON file ({exc})") from None
    value = raw.get("uva_read_gbps") if isinstance(raw, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"--preflight {path}: no positive number under 'uva_read_gbps' (got {value!r})")
    gpu = raw.get("gpu") if isinstance(raw.get("gpu"), str) else "its GPU"
    return float(value), f"measured by the runner's preflight ({path.name}, {gpu})"


@dataclass(frozen=True)
class MoEShape:
    experts: int
    top_k: int
    hidden: int
    intermediate: int  # per expert
    layers: int  # MoE layers
    bytes_per_element: int = 2

    @property
    def expert_bytes(self) -> int:
        """w13 (2 x intermediate x hidden) + w2 (hidden x intermediate) of one expert, one layer."""
        return 3 * self.intermediate * self.hidden * self.bytes_per_element

    def describe(self) -> str:
        return (
            f"{self.experts} experts, top-{self.top_k}, hidden {self.hidden}, expert intermediate "
            f"{self.intermediate}, {self.layers} MoE layers, {self.bytes_per_element} B/element "
            f"({self.expert_bytes / 2**20:.2f} MiB per expert per layer)"
        )

    @classmethod
    def parse(cls, text: str) -> MoEShape:
        """``experts=128,top_k=8,hidden=2048,intermediate=768,layers=48[,dtype=bf16]``."""
        fields: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"--moe-shape: {part!r} is not KEY=VALUE")
            fields[key.strip()] = value.strip()
        dtype = fields.pop("dtype", "bf16")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"--moe-shape: unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
        want = ("experts", "top_k", "hidden", "intermediate", "layers")
        missing = [k for k in want if k not in fields]
        unknown = [k for k in fields if k not in want]
        if missing or unknown:
            raise ValueError(f"--moe-shape: missing {missing}, unknown {unknown}; give {', '.join(want)}[,dtype]")
        return cls(**{k: int(fields[k]) for k in want}, bytes_per_element=DTYPE_BYTES[dtype])

    @classmethod
    def from_config(cls, model_dir: str | Path) -> MoEShape | None:
        """From a Hugging Face ``config.json`` of a Qwen3-MoE-like model; None when it is not one."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            return None
        cfg = json.loads(path.read_text())
        cfg = cfg.get("text_config", cfg)
        try:
            experts = int(cfg.get("num_experts") or cfg["num_local_experts"])
            top_k = int(cfg["num_experts_per_tok"])
            hidden = int(cfg["hidden_size"])
            inter = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
            total = int(cfg["num_hidden_layers"])
        except (KeyError, TypeError, ValueError):
            return None
        dense = set(cfg.get("mlp_only_layers") or [])
        step = int(cfg.get("decoder_sparse_step") or 1)
        layers = sum(1 for i in range(total) if i not in dense and (i + 1) % step == 0)
        quant = (cfg.get("quantization_config") or {}).get("quant_method", "")
        if quant == "fp8":
            elt = 1
        else:
            elt = DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2)
        return cls(experts, top_k, hidden, inter, layers, elt)


def naive_region(shape: MoEShape, c: int) -> bool:
    """Whether a decode step of ``c`` tokens is in the naive region (the spec's, ``docs/spec.md``)."""
    return in_naive_region(MoECase(num_tokens=c, top_k=shape.top_k, num_experts=shape.experts))


def expected_unique_experts(experts: int, top_k: int, tokens: int) -> float:
    """E * (1 - (1 - k/E)^c): expected distinct experts among c tokens routed uniformly."""
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def measured_reads(steps: Sequence[Sequence[Sequence[int]]]) -> tuple[float, float]:
    """Mean (pairs, unique experts) per step from routed top-k ids, through the traffic model."""
    from moegate.kernels.traffic import naive_blocks, sorted_blocks  # imports torch at its top

    if not steps:
        raise ValueError("routing sample has no steps")
    pairs = sum(len(naive_blocks(s)) for s in steps) / len(steps)
    unique = sum(len(sorted_blocks(s, block_m=max(1, sum(len(r) for r in s)))) for s in steps) / len(steps)
    return pairs, unique


@dataclass(frozen=True)
class LevelTraffic:
    concurrency: int
    pairs: float  # per step per layer
    unique: float  # per step per layer
    source: str  # "uniform model" or "routing sample (N steps)"
    naive_bytes: float  # per step, all MoE layers, host bytes
    sorted_bytes: float
    paths: dict[str, str]  # build label -> "naive" | "sorted"

    def bytes_for(self, label: str) -> float:
        return self.naive_bytes if self.paths[label] == "naive" else self.sorted_bytes


@dataclass(frozen=True)
class TrafficModel:
    shape: MoEShape
    host_fraction: float = 1.0
    uva_peak_gbps: float = DEFAULT_UVA_PEAK_GBPS
    routing: Mapping[int, Sequence[Sequence[Sequence[int]]]] | None = None
    # build label -> has the PR's rule (host-resident weights always sorted)
    sorted_always: Mapping[str, bool] | None = None
    peak_source: str = DEFAULT_PEAK_SOURCE

    def level(self, c: int) -> LevelTraffic:
        if self.routing is not None and c in self.routing:
            pairs, unique = measured_reads(self.routing[c])
            source = f"routing sample ({len(self.routing[c])} steps)"
        else:
            pairs = float(c * self.shape.top_k)
            unique = expected_unique_experts(self.shape.experts, self.shape.top_k, c)
            source = "uniform model"
        per_read = self.shape.expert_bytes * self.shape.layers * self.host_fraction
        rules = self.sorted_always if self.sorted_always is not None else {"base": False, "pr": True}
        paths = {
            label: ("sorted" if always or not naive_region(self.shape, c) else "naive")
            for label, always in rules.items()
        }
        return LevelTraffic(c, pairs, unique, source, pairs * per_read, unique * per_read, paths)

    def achieved_gbps(self, c: int, label: str, tok_s: float) -> float:
        """Host bytes per step x (tok/s / c) steps per second, in GB/s (1e9)."""
        return self.level(c).bytes_for(label) * (tok_s / c) / 1e9

    def describe(self) -> str:
        return (
            f"{self.shape.describe()}; {self.host_fraction:.0%} of experts host-resident; UVA read bandwidth "
            f"{self.uva_peak_gbps:g} GB/s, {self.peak_source}"
        )


def load_routing(path: str | Path) -> dict[int, list[list[list[int]]]]:
    """A routing sample: JSON ``{"<concurrency>": [step, ...]}``, a step a list of per-token top-k ids."""
    raw = json.loads(Path(path).read_text())
    if not isinstance(raw, dict):
        raise TypeError(f"{path}: expected an object keyed by concurrency")
    return {int(k): [[[int(e) for e in tok] for tok in step] for step in v] for k, v in raw.items()}
