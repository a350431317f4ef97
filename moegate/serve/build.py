"""A build: a Python environment where some vLLM imports, plus the flags it always runs with.

The e2e and A/B tiers take two builds (``base`` and ``pr``) and run them one after
the other with identical flags; a build's own ``server_args`` let the same
environment be compared under two flag sets (experts resident against UVA-offloaded).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class BuildError(RuntimeError):
    """A build that cannot serve: no such interpreter, or its vLLM does not import."""


_DESCRIBE = r"""
import json, platform, sys
out = {"python": platform.python_version()}
try:
    import vllm
    out["vllm"] = getattr(vllm, "__version__", "unknown")
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
try:
    import torch
    out["torch"] = torch.__version__
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(0)
        out["cuda"] = torch.version.cuda
        import subprocess
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, check=False)
        out["driver"] = q.stdout.strip().splitlines()[0] if q.returncode == 0 and q.stdout.strip() else None
    else:
        out["device"] = "cpu"
except Exception:
    pass
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Build:
    """One side of a comparison.

    ``python`` is the interpreter of the build's environment; ``env`` (any ``KEY=VALUE``,
    for example ``VLLM_USE_FLASHINFER_SAMPLER=0``) is added to the server's environment;
    ``server_args`` are appended to every server start of this build.
    """

    label: str
    python: str
    env: Mapping[str, str] = field(default_factory=dict)
    server_args: tuple[str, ...] = ()

    def environ(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def describe(self, timeout_s: float = 180) -> dict[str, Any]:
        """vLLM, torch, Python and device of this build, read by its own interpreter.

        Raises ``BuildError`` with one line when the interpreter is missing or vLLM does
        not import there: the gate must not start a server that cannot exist.
        """
        if not Path(self.python).exists():
            raise BuildError(f"build {self.label}: no interpreter at {self.python}")
        try:
            proc = subprocess.run(
                [self.python, "-c", _DESCRIBE],
                env=self.environ(),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise BuildError(f"build {self.label}: importing vLLM took over {timeout_s:.0f} s") from None
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise BuildError(f"build {self.label}: {self.python} failed to describe itself: {tail}")
        info: dict[str, Any] = json.loads(lines[-1])
        if "error" in info:
            raise BuildError(f"build {self.label}: vLLM does not import with {self.python}: {info['error']}")
        return info

    def command_line(self) -> str:
        """How a reader reproduces this build's server (for result pages)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        args = " ".join(shlex.quote(a) for a in self.server_args)
        return " ".join(p for p in (env, self.python, "-m vllm.entrypoints.openai.api_server", args) if p)


def parse_build(label: str, spec: str, *, server_args: str = "", env: Mapping[str, str] | None = None) -> Build:
    """``spec`` is the path of an interpreter or of a venv directory (its ``bin/python``)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "bin" / "python"
    return Build(label, str(path), dict(env or {}), tuple(shlex.split(server_args)))


def env_pairs(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` words (a build's ``--*-env`` options) as a mapping; anything else is a ValueError."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--*-env takes KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def positive_ints(text: str) -> tuple[int, ...]:
    """``1,2,4`` as (1, 2, 4): the in-flight counts and concurrency levels the e2e and A/B command lines take.

    An argparse type: a word that is not an integer, no number at all, or one below 1 is
    one ``ArgumentTypeError`` line.
    """
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, at least one: {text!r}")
    return vals
