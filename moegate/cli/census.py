"""``moegate census ...``: the census of vLLM's MoE configurations, ``python -m moegate.vllm.census`` (issue 30).

The census lands with its own branch; until ``moegate/vllm/census`` is in this checkout the subcommand says so in
one line (exit 2). Once it is, its ``main(argv)`` runs unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

CENSUS = "moegate.vllm.census.__main__"


def main(argv: list[str] | None = None) -> int:
    if importlib.util.find_spec("moegate.vllm.census") is None:
        print("moegate census: not in this checkout yet (moegate/vllm/census, issue 30)", file=sys.stderr)
        return 2
    module = importlib.import_module(CENSUS)  # by name: the census is another branch's, present or not
    return int(module.main(argv) or 0)
