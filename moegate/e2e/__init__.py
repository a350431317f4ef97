"""The e2e tier: real `vllm serve` processes of two builds, compared on greedy output and GSM8K.

Nothing here imports vLLM: every server runs in its build's own Python, in its own
process group, and is spoken to over HTTP on loopback.
"""
