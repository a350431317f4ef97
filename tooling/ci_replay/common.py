"""What the replay's parts share: its constants, its one error type, a subprocess helper, the workflows."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from moegate.paths import RESULTS_DIR, ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
RESULTS = RESULTS_DIR
REPO = "moegate/moegate"  # github.repository in the replay (act reads it from the copy's `origin`)
PINNED = re.compile(r"uses:\s*([\w.-]+)/([\w.-]+)(?:/[^@\s]*)?@([0-9a-f]{40})")
STUBBED_ACTIONS = {("actions", "upload-artifact"), ("actions", "download-artifact")}  # no snapshot holds their dist/
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # not /usr/local/bin: this machine keeps CUDA's nvcc there
ANSI = re.compile(r"\x1b\[[0-9;]*m")
ACT_DIR = "a"  # act's folder in a run: short, like a runner's /home/runner/work/_temp
# a host-mode job's TMPDIR is <act>/<16 hex>/tmp/moegate-job/tmp (.ci/job-env); vLLM binds its engine's
# ZMQ socket there as <uuid4>, and a Unix socket path has at most 107 bytes (sockaddr_un.sun_path)
JOB_SOCKET_TAIL = "/0123456789abcdef/tmp/moegate-job/tmp/" + "0" * 36
SOCKET_PATH_MAX = 107
HASH_DIR = re.compile(r"^[0-9a-f]{16}$")  # act's per-job folder in host mode (workspace, RUNNER_TEMP)


class ReplayError(RuntimeError):
    """A replay that cannot start: one line, exit 2."""


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, text=True, capture_output=True)


def load_workflows(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted((root / ".github" / "workflows").glob("*.yml"))}


def step_name(step: object) -> str:
    """A step as the results name it: its name, or the first line of its script."""
    lines = str(step or "").strip().splitlines()
    return (lines[0][:80] + (" ..." if len(lines) > 1 or len(lines[0]) > 80 else "")) if lines else "?"
