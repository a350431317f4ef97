"""Offload truth on the GPU: the plan of engine runs (``python -m moegate offload-truth``), one engine's
observation (``engine``), the page (``report``). The verdict itself is ``moegate.offload.verdict``."""
