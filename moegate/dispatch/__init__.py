"""Observing vLLM's dispatch: the adapter the dispatch and kernel tiers drive, and the names it relies on.

With ``moegate.builds`` and ``moegate.offload``, one of the three rooms that import vLLM
(tests/unit/test_vllm_imports.py).

- ``names``: every vLLM module path and private name moegate relies on, the UVA
  marker and the error types; a leaf that imports nothing.
- ``recorders``: the stand-ins that observe each call (one ``Launch`` record per kernel launch).
- ``target``: ``VllmTarget``, which drives both fused-MoE entrypoints.
- ``calls``: how a case becomes each entrypoint's call (quant config, experts, workspaces).
- ``uva``: host residency as vLLM makes it (marker, UVA host views, offloader, loader context).
- ``environment``: ``describe_environment``, for report headers and golden provenance.
- ``offline``: the public offline-engine API the engine scenarios use.
- ``site_probes``: the dispatch sites beyond the two entrypoints that the census finds, each driven to its decision.
- ``checkpoints``: how vLLM reads a pre-quantized checkpoint (its config, skipped modules, expert names).

Nothing is imported here: ``names`` must stay importable without torch or vLLM.
"""
