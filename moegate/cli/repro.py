"""``moegate repro '<case json>' [--entrypoint legacy|modular]``: one reported case through the installed vLLM.

Prints one JSON line per entrypoint (observed path, the spec's, ok) and exits 1 when any differs, 2 when
vLLM does not import here.
"""

from __future__ import annotations

import argparse
import json
import sys

from moegate.cli.spec import parse_case
from moegate.core.case import ENTRYPOINTS
from moegate.core.spec import expected_path
from moegate.vllm.names import TargetError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moegate repro", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("case", help="the JSON a failure prints after 'reproduce:'")
    parser.add_argument("--entrypoint", choices=ENTRYPOINTS, action="append")
    args = parser.parse_args(argv)
    case = parse_case(args.case)

    from moegate.vllm.target import VllmTarget  # imports torch at its top: `moegate spec` runs without it

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
