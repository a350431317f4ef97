"""What the dispatch and kernel tiers exercise of vLLM's fused MoE, measured (docs/design/reach.md).

``run`` runs the tiers under coverage.py (``branches`` reduces its report, ``plugin`` records the Triton
variants and the conditions), ``requirements`` maps the census's configurations to what they need
exercised, ``reasons`` reads the reviewed reasons for what is not, ``evaluate`` judges, ``report`` writes
``results/reach.md`` and ``results/reach.json.xz``.
"""
