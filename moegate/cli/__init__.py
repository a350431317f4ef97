"""The front door: ``moegate COMMAND ...``, one subcommand for each thing a user does.

    moegate gate --vllm-python PATH | --wheel FILE | --vllm VERSION [--tiers dispatch,kernels,sweep]
    moegate e2e run --base PY --pr PY --model DIR ...   the e2e comparison of two builds
    moegate ab --base-python PY --pr-python PY ...      the A/B (decode time) of two builds
    moegate sweep [--cases N] ...                       the kernel sweep (a CUDA GPU)
    moegate diff --base-python PY --pr-python PY ...    the differential kernel tier (a CUDA GPU)
    moegate preflight [--json FILE] ...                 can this runner run the GPU tiers?
    moegate fetch-gsm8k [--dir DIR]                     GSM8K from its authors, sha256-checked
    moegate make-build DEST --python PY [--site DIR]... [--bug SPEC]   a build as an interpreter (e2e, A/B)
    moegate tiny-model DEST                             the tiny Qwen3-MoE model the e2e and A/B tiers serve
    moegate gsm8k run|compare ...                       one GSM8K run against a running server; two compared
    moegate repro '<case json>' / moegate spec '<case json>'
    moegate census ... / moegate census paths           vLLM's MoE configurations; the paths a CI filter watches
    moegate buildkite --moegate-repo URL --moegate-ref SHA   the gate as a test area of vLLM's Buildkite CI
    moegate power --vllm-python PY ...                  the dispatch tier's mutation score
    moegate power join SHARD_DIR... --out DIR           one report from a power run's shards
    moegate offload-truth --python PY --out DIR ...     offload truth on a CUDA GPU
    moegate builds changes|hashes|compare|pin|rebuild-moe  which binaries a vLLM PR's builds hold
    moegate reach run|report ...                        what the tiers exercise of vLLM's fused MoE (coverage)

and, for moegate's own measurements (``MAINTAINERS``): ``ab-spread``, ``ab-simulate``, ``text-routing``,
``train-tiny``.

Each subcommand lives in a module of its own: this package's (``gate``, ``repro``, ``spec``,
``fetch_gsm8k``, ``census``, ``buildkite``, ``builds``, ``gsm8k``) or the tier's command line it hands its arguments
to unchanged (``python -m moegate.e2e`` is ``moegate e2e``, and so on). Only the subcommand that runs is
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
    "make-build": ("moegate.builds.planted", "make a build: a venv of a Python that sees vLLM sites first, optionally with a planted bug"),
    "tiny-model": ("moegate.model.tiny_model", "write the tiny Qwen3-MoE checkpoint the e2e and A/B tiers serve (--model DIR)"),
    "gsm8k": ("moegate.cli.gsm8k", "one GSM8K run through lm-eval against a running server, or two runs' records compared"),
}  # fmt: skip
"""Subcommand -> (the module whose ``main(argv)`` runs it, one line of help)."""

MAINTAINERS: dict[str, tuple[str, str]] = {
    "ab-spread": ("moegate.ab.spread", "an A/B run's within- and between-start spread, per level (docs/design/ab.md)"),
    "ab-simulate": ("moegate.ab.simulate", "the A/B rule's false verdicts and power over runs drawn like measured ones"),
    "text-routing": ("moegate.model.text_routing", "a model's routing statistics over ShareGPT text (the router fit's target)"),
    "train-tiny": ("moegate.model.tiny_train", "train the committed tiny model (models/e2e-trained/), or check its record"),
}  # fmt: skip
"""moegate's own measurements, listed apart in the usage: what its results pages were made with."""

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
    "gsm8k": "e2e",
    "ab-spread": "ab",
    "ab-simulate": "ab",
}
"""Subcommand -> the extra of pyproject.toml whose packages its module imports (a bare install has none of them)."""


def usage() -> str:
    width = max(map(len, {**COMMANDS, **MAINTAINERS}))
    lines = ["usage: moegate COMMAND [ARGS...]   (moegate COMMAND --help: its options)", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "moegate's own measurements (what its results pages were made with):"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in MAINTAINERS.items()]
    return "\n".join(lines)


def entry(name: str) -> Callable[[list[str]], int | None]:
    """The ``main`` of subcommand ``name``'s module, imported now (only the one that runs)."""
    module = importlib.import_module({**COMMANDS, **MAINTAINERS}[name][0])  # by name: only the one that runs
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
    if name not in COMMANDS and name not in MAINTAINERS:
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
