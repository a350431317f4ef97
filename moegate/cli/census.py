"""``moegate census ...``: the census of vLLM's MoE configurations (``moegate/vllm/census``, docs/census.md).

Its arguments go unchanged to ``python -m moegate.vllm.census``: ``--check`` (the default), ``--bless``,
``--out FILE``, ``--vllm-root DIR``.
"""

from __future__ import annotations

from moegate.vllm.census.__main__ import main as census_main


def main(argv: list[str] | None = None) -> int:
    return int(census_main(argv) or 0)
