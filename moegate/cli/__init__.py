"""The front door: ``moegate COMMAND ...``, one subcommand for each thing a user does.

    moegate gate --vllm-python PATH | --wheel FILE | --vllm VERSION [--tiers dispatch,kernels,sweep]
    moegate e2e run --base PY --pr PY --model DIR ...   the e2e comparison of two builds
    moegate ab --base-python PY --pr-python PY ...      the A/B (decode time) of two builds
    moegate sweep [--cases N] ...                       the kernel sweep (a CUDA GPU)
    moegate diff --base-python PY --pr-python PY ...    the differential kernel tier (a CUDA GPU)
    moegate preflight [--json FILE] ...                 can this runner run the GPU tiers?
    moegate fetch-gsm8k [--dir DIR]                     GSM8K from its authors, sha256-checked
    moegate repro '<case json>' / moegate spec '<case json>'
    moegate census ... / moegate census paths           vLLM's MoE configurations; the paths a CI filter watches
    moegate buildkite --moegate-repo URL --moegate-ref SHA   the gate as a test area of vLLM's Buildkite CI
    moegate power --vllm-python PY ...                  the dispatch tier's mutation score
    moegate power join SHARD_DIR... --out DIR           one report from a power run's shards
    moegate offload-truth --python PY --out DIR ...     offload truth on a CUDA GPU (python -m moegate offload-truth)
    moegate builds changes|hashes|compare|pin|rebuild-moe  which binaries a vLLM PR's builds hold
    moegate reach run|report ...                        what the tiers exercise of vLLM's fused MoE (coverage)

Each subcommand lives in a module of its own: this package's (``gate``, ``repro``, ``spec``,
``fetch_gsm8k``, ``census``, ``buildkite``, ``builds``) or the tier's command line it hands its arguments to unchanged
(``python -m moegate.e2e`` is ``moegate e2e``, and so on). Only the subcommand that runs is
imported, so ``moegate spec`` needs no torch and ``moegate --help`` no vLLM.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

COMMANDS: dict[str, tuple[str, str]] = {
    "gate": ("moegate.cli.gate", "gate one vLLM build (a Python, a wheel or a release): dispatch, kernels, sweep"),
    "e2e": ("moegate.e2e.__main__", "compare two builds end to end: greedy tokens, scores, GSM8K (python -m moegate.e2e)"),
    "ab": ("moegate.ab.__main__", "compare two builds' decode time a token, servers started in turn (python -m moegate.ab)"),
    "sweep": ("moegate.kernels.sweep", "the kernel sweep: generated cases in worker processes on a CUDA GPU"),
    "preflight": ("moegate.preflight.cli", "check and measure this runner: GPU, PCIe, UVA read bandwidth, pinnable memory, disk"),
    "fetch-gsm8k": ("moegate.cli.fetch_gsm8k", "download GSM8K from its authors' repository and check its sha256"),
    "diff": ("moegate.kernels.diff_tier", "the differential kernel tier: a base build against a PR's on the same cases (a CUDA GPU)"),
    "repro": ("moegate.cli.repro", "run one reported case through the installed vLLM and compare with the spec"),
    "spec": ("moegate.cli.spec", "print the path the spec requires for a case"),
    "census": ("moegate.cli.census", "the census of vLLM's MoE configurations; `census paths`: the paths a CI filter watches"),
    "buildkite": ("moegate.cli.buildkite", "print the gate as a test area of vLLM's Buildkite CI (dispatch on CPU, kernels on GPU)"),
    "power": ("moegate.power.cli", "the dispatch tier's mutation score on vLLM's dispatch code (python -m moegate.power)"),
    "offload-truth": ("moegate.offload.plan", "on a CUDA GPU: is every weight marked host-resident host memory, by the driver's word?"),
    "builds": ("moegate.cli.builds", "a PR's builds: compiled changes, extension hashes, the precompiled pin, the MoE rebuild"),
    "reach": ("moegate.reach.__main__", "what the tiers exercise: branches, Triton variants, conditions (python -m moegate.reach)"),
}  # fmt: skip
"""Subcommand -> (the module whose ``main(argv)`` runs it, one line of help)."""

EXTRAS = {
    "e2e": "e2e",
    "ab": "ab",
    "sweep": "vllm",
    "census": "vllm",
    "power": "power",
    "repro": "vllm",
    "offload-truth": "vllm",
    "diff": "vllm",
    "reach": "reach",
}
"""Subcommand -> the extra of pyproject.toml whose packages its module imports (a bare install has none of them)."""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: moegate COMMAND [ARGS...]   (moegate COMMAND --help: its options)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def entry(name: str) -> Callable[[list[str]], int | None]:
    """The ``main`` of subcommand ``name``'s module, imported now (only the one that runs)."""
    module = importlib.import_module(COMMANDS[name][0])  # by name: a subcommand's imports cost only when it runs
    main: Callable[[list[str]], int | None] = module.main
    return main


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader stopped early (`moegate --help | head`): no traceback for it. Python's own advice: point stdout
        # at devnull so the flush at exit does not raise again, and exit 1 as Python does on EPIPE.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"moegate: unknown command {name!r}; known: {', '.join(COMMANDS)} (moegate --help)", file=sys.stderr)
        return 2
    try:
        run = entry(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "moegate").split(".")[0] == "moegate":
            raise  # moegate's own module missing is a broken install or a bug, not a missing extra
        extra = EXTRAS.get(name, "unit")
        print(
            f"moegate {name}: needs the package {exc.name!r}, not installed in this Python"
            f" (pip install 'moegate[{extra}]')",
            file=sys.stderr,
        )
        return 2
    status = run(rest)
    return int(status or 0)
