"""Offload truth on the GPU: is every weight vLLM marks host-resident host memory, by the CUDA driver's word?

- ``plan``: every run's engine side by side (``moegate offload-truth``).
- ``engine``: one engine's observation, a process of its own.
- ``residency``: every weight's marker and memory in a loaded model (imports vLLM's offloader);
  ``pointers``: the CUDA driver's word on where a pointer points.
- ``verdict``: the judgement of one observation; ``report``: the page.
"""
