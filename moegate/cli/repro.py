"""``moegate repro '<case json>' [--entrypoint legacy|modular] [--kernels]``: one reported case through the installed
vLLM.

Without ``--kernels``: the dispatch path each entrypoint takes against the spec's (a CPU is enough). With
``--kernels``, on a CUDA GPU: the case run to the end with the kernel tier's own inputs (``moegate.kernels.inputs``:
weights seeded by the case's shape, hidden states and routing by its routing seed, so a failure reproduces) and
judged as the kernel tier judges it (``moegate.kernels.check.run_checked``: the torch reference under the tolerance
rule, and the path). Prints one JSON line per entrypoint and exits 1 when any differs or is outside the tolerance,
2 when vLLM does not import here (or, with ``--kernels``, no CUDA GPU or UVA is there): one line.
"""

from __future__ import annotations

import argparse
import json
import sys

from moegate.cli.spec import parse_case
from moegate.core.case import ENTRYPOINTS, MoECase
from moegate.core.spec import expected_path
from moegate.dispatch.names import TargetError


def _kernels(case: MoECase, entrypoints: list[str]) -> int:
    import torch  # the kernel check runs on a CUDA GPU

    if not torch.cuda.is_available():
        print("moegate repro: --kernels runs the case on a CUDA GPU, and torch here sees none", file=sys.stderr)
        return 2
    from moegate.dispatch.target import VllmTarget  # imports torch at its top
    from moegate.kernels.check import run_checked  # imports torch at its top
    from moegate.kernels.inputs import WeightBank  # imports torch at its top

    try:
        target = VllmTarget(finish=True, weights=WeightBank)
    except TargetError as exc:
        print(f"moegate: {exc}", file=sys.stderr)
        return 2
    try:
        if not target.uva_available():
            print("moegate repro: --kernels needs UVA (pinned host memory the GPU reads in place)", file=sys.stderr)
            return 2
        bank = WeightBank(target.device, target.host_view)
        ok = True
        for ep in entrypoints:
            result = run_checked(target, bank, case, ep)
            want = expected_path(case, ep)
            good = result.closeness.ok and result.path == want.path.value
            ok &= good
            line = {"vllm": target.version, "entrypoint": ep, "path": result.path, "expected": str(want)}
            print(json.dumps({**line, "closeness": str(result.closeness), "ok": good}))
    finally:
        target.close()
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moegate repro", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("case", help="the JSON a failure prints after 'reproduce:' (or its page's case)")
    parser.add_argument("--entrypoint", choices=ENTRYPOINTS, action="append")
    parser.add_argument(
        "--kernels", action="store_true", help="run the case to the end on a GPU, against the reference"
    )
    args = parser.parse_args(argv)
    case = parse_case(args.case)
    if args.kernels:
        return _kernels(case, args.entrypoint or list(ENTRYPOINTS))

    from moegate.dispatch.target import VllmTarget  # imports torch at its top: `moegate spec` runs without it

    try:
        target = VllmTarget(finish=False)  # the path is decided before any kernel runs
    except TargetError as exc:
        print(f"moegate: {exc}", file=sys.stderr)
        return 2
    ok = True
    for ep in args.entrypoint or ENTRYPOINTS:
        obs = target.run(case, ep)
        want = expected_path(case, ep)
        good = obs.path == want.path.value
        ok &= good
        print(
            json.dumps(
                {"vllm": target.version, "entrypoint": ep, "observed": obs.path, "expected": str(want), "ok": good}
            )
        )
    target.close()
    return 0 if ok else 1
