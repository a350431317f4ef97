"""Does vLLM import in a build's interpreter, and what can that interpreter run? Asked in a process of its own.

``moegate gate`` asks before any tier runs: a build whose vLLM does not import is a failing gate with one line that
names the build and the import's error (a dev build's broken ``import vllm`` is the pull request's bug), never a
skipped tier. The same process says the version the build reports, whether its torch sees a CUDA GPU (the kernel
tier needs one) and which of the packages the tests need are missing (``--vllm-python`` installs nothing).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

TEST_PACKAGES = ("pytest", "hypothesis")
"""What every tier's pytest run needs beside vLLM (pyproject.toml's ``dependencies``)."""

_SCRIPT = """
import importlib.util, json, sys
out = {"python": sys.version.split()[0], "missing": [m for m in NEEDED if importlib.util.find_spec(m) is None]}
try:
    import vllm
    out["version"] = str(getattr(vllm, "__version__", "unknown"))
except BaseException as exc:
    lines = [l for l in str(exc).splitlines() if l.strip()] or [""]
    out["error"] = (type(exc).__name__ + ": " + lines[0]).rstrip(": ")
if "version" in out:  # vLLM imported torch already: asking it costs nothing more
    import torch
    out["cuda"] = bool(torch.cuda.is_available())
    out["torch"] = torch.__version__
print("MOEGATE-PROBE " + json.dumps(out))
""".replace("NEEDED", repr(TEST_PACKAGES))


@dataclass(frozen=True)
class Probe:
    python: str
    version: str | None = None
    """``vllm.__version__`` where vLLM imports."""
    error: str | None = None
    """Why it does not import: the exception's type and first line."""
    cuda: bool | None = None
    """torch sees a CUDA GPU (None: not asked, vLLM did not import)."""
    missing: tuple[str, ...] = ()
    """Test packages the interpreter lacks."""

    @property
    def imports(self) -> bool:
        return self.version is not None


def import_error() -> str | None:
    """Why ``import vllm`` fails in this process (the exception's type and first line), or None when it imports: what
    a vLLM tier's pytest run asks before its tests (``tests/conftest.py``)."""
    try:
        import vllm  # noqa: F401 - the tiers' own import, done once here so a failure is one line
    except Exception as exc:  # noqa: BLE001 - a dev build's import can fail with any exception
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first}".rstrip(": ")
    return None


def probe(python: str | Path, cwd: str | Path, timeout: float = 600.0) -> Probe:
    """Import vLLM (and torch) in ``python`` run from ``cwd`` (the checkout: moegate imports from there)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    try:
        proc = subprocess.run(
            [str(python), "-c", _SCRIPT], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except OSError as exc:
        return Probe(str(python), error=f"cannot run {python}: {exc.strerror or exc}")
    except subprocess.TimeoutExpired:
        return Probe(str(python), error=f"import vllm did not finish in {timeout:g} s")
    marked = [line for line in proc.stdout.splitlines() if line.startswith("MOEGATE-PROBE ")]
    if not marked:  # the interpreter died before printing (a crash in an extension's import)
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}, no output"])[-1]
        return Probe(str(python), error=f"the interpreter died importing vLLM: {tail}")
    out = json.loads(marked[-1].removeprefix("MOEGATE-PROBE "))
    return Probe(
        str(python),
        version=out.get("version"),
        error=out.get("error"),
        cuda=out.get("cuda"),
        missing=tuple(out.get("missing", ())),
    )
