"""Helpers of the CI workflows (``.github/workflows``), runnable without installing anything.

- ``gate_plan``: the reusable workflow's input checks and build specs (``python -m tooling.ci.gate_plan``).
- ``junit_min``: the minimum of executed tests read from a JUnit report (``python -m tooling.ci.junit_min``).
"""
