"""Helpers of the CI workflows (``.github/workflows``), runnable without installing anything.

- ``gate_plan``: the reusable workflow's input checks and build specs (``python -m tooling.ci.gate_plan``).
- ``gpu_leg``: one GPU leg as the ``gpu`` job and the H200 rehearsal both run it (``python -m tooling.ci.gpu_leg``).

The kernel legs' floor of executed tests is ``moegate gate --min-kernel-tests`` (``moegate/core/junit.py``).
"""
