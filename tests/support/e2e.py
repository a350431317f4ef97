"""What the e2e tier's tests share: the CPU smoke's server flags and size, and the CLI as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import ROOT

SMOKE_SERVER_ARGS = (
    "--max-model-len 4096 --enforce-eager --dtype bfloat16 --max-num-seqs 4 --no-enable-prefix-caching"
    " --gpu-memory-utilization 0.2"
)
"""The CPU smoke's flags; the golden of the smoke is keyed by them."""
SMOKE_SIZE = [
    "--prompts=8", "--max-tokens=32", "--in-flight=1,4", "--gsm8k-limit=10", "--gsm8k-in-flight=1", "--gsm8k-detect=1.0",
]  # fmt: skip
"""GSM8K one request at a time here: with lm-eval's 4 independent requests in flight the random model's
responses were not reproducible even on the CPU (a same-server repeat changed 1 of 10), and a smoke that
fails by chance would cry wolf; the self-check that catches that is what the gate does at 4 in flight.
``--gsm8k-detect=1.0``: at 10 questions the exact McNemar test resolves nothing smaller than 9 answers
all one way (docs/design/e2e-rules.md), so that is what the smoke promises; the default 0.05 would grow it to 40."""
SMOKE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_WAIT_POLICY": "PASSIVE",
    "OMP_NUM_THREADS": "1",
}  # fmt: skip
"""The smoke's servers' environment, as the sessions give theirs (``tooling/serving.CPU_SERVER_ENV``, which says
why): 1 GiB of KV cache each, the model run in the engine's process on one OpenMP thread that sleeps
when it waits."""


def run_e2e(*args: str, timeout_s: float = 1500, cmd: str = "run") -> subprocess.CompletedProcess[str]:
    """``python -m moegate.e2e run ...`` (or ``compare``) as a user runs it; output captured for the assertions."""
    return subprocess.run(
        [sys.executable, "-m", "moegate.e2e", cmd, *args],
        cwd=ROOT, env={**SMOKE_ENV, **os.environ},
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
