"""The only package that imports vLLM.

- ``names``: every vLLM module path and private name moegate relies on, the UVA
  marker and the error types; a leaf that imports nothing.
- ``recorders``: the stand-ins that observe each call (one ``Launch`` record per kernel launch).
- ``target``: ``VllmTarget``, which drives both fused-MoE entrypoints.
- ``calls``: how a case becomes each entrypoint's call (quant config, experts, workspaces).
- ``uva``: host residency as vLLM makes it (marker, UVA host views, offloader, loader context).
- ``environment``: ``describe_environment``, for report headers and golden provenance.
- ``offline``: the public offline-engine API the engine scenarios use.
- ``bench_serve``: the in-process ``vllm bench serve`` runner of the A/B tier.
- ``probe``: does vLLM import in a build's interpreter (a process of its own): ``moegate gate`` asks first.
- ``wheels``: is a wheel vLLM's, read from its METADATA before anything is installed.
- ``devsite``: a dev-versioned copy of an installed vLLM (``python -m moegate.builds.devsite``).

Nothing is imported here: ``names`` must stay importable without torch or vLLM.
"""
