"""Command line: reproduce a reported case, or ask the spec.

python -m moegate repro '<case json from a failure message>' [--entrypoint legacy|modular]
python -m moegate spec  '<case json>'
"""

from __future__ import annotations

import argparse
import json
import sys

from moegate.core.case import ENTRYPOINTS, MoECase
from moegate.core.spec import expected_path
from moegate.vllm.names import TargetError


def _case(text: str) -> MoECase:
    try:
        return MoECase.from_json(text)
    except (ValueError, TypeError, KeyError) as exc:
        raise SystemExit(f"moegate: not a case: {exc} (pass the JSON printed after 'reproduce:')") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moegate", description="moegate command line")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rp = sub.add_parser("repro", help="run one case through the installed vLLM and compare with the spec")
    rp.add_argument("case")
    rp.add_argument("--entrypoint", choices=ENTRYPOINTS, action="append")
    sp = sub.add_parser("spec", help="print the path the spec requires for a case")
    sp.add_argument("case")
    args = parser.parse_args(argv)

    case = _case(args.case)
    if args.cmd == "spec":
        for ep in ENTRYPOINTS:
            print(f"{ep}: {expected_path(case, ep)}")
        return 0

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


if __name__ == "__main__":
    raise SystemExit(main())
