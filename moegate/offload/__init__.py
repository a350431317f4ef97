"""Offload truth on the GPU: the plan of engine runs (``python -m moegate.offload.plan``), one engine's
observation (``engine``), the page (``report``). The verdict itself is ``moegate.vllm.offload_truth``."""
