"""Throughput A/B between two vLLM builds: driver, verdict rule, evidence, report (no vLLM import here)."""
