"""``moegate spec '<case json>'``: the path the spec requires for a case at each entrypoint (no vLLM, no torch)."""

from __future__ import annotations

import argparse

from moegate.core.case import ENTRYPOINTS, MoECase
from moegate.core.spec import expected_path


def parse_case(text: str) -> MoECase:
    """A case from the JSON a failure prints after ``reproduce:``; anything else is one line and exit 2."""
    try:
        return MoECase.from_json(text)
    except (ValueError, TypeError, KeyError) as exc:
        raise SystemExit(f"moegate: not a case: {exc} (pass the JSON printed after 'reproduce:')") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="moegate spec", description="print the path the spec requires for a case")
    parser.add_argument("case", help="the JSON a failure prints after 'reproduce:'")
    case = parse_case(parser.parse_args(argv).case)
    for ep in ENTRYPOINTS:
        print(f"{ep}: {expected_path(case, ep)}")
    return 0
