"""Helpers of the CI workflows (``.github/workflows``), runnable without installing anything.

- ``gate_plan``: the reusable workflow's input checks and build specs (``python -m tooling.ci.gate_plan``).
- ``gpu_leg``: one GPU leg as the ``gpu`` job and the H200 rehearsal both run it (``python -m tooling.ci.gpu_leg``).
- ``leg_pages``: each tier job's outcome and page; the verdict job names each failing leg with its page.
- ``moe_paths``: the vLLM paths that reach the fused MoE, generated from the census (``moe-paths.txt``).
- a vLLM repository's verdict: ``policy`` (the policy file), ``run_check`` (did the run do at least that),
  ``verdict`` (``python -m tooling.ci.verdict``: read the run through ``github_api``, judge, post the status).
- ``vllm_main``: the nightly run against vLLM's main branch (its wheel, its fit).

The kernel legs' floor of executed tests is ``moegate gate --min-kernel-tests`` (``moegate/core/junit.py``).
"""
