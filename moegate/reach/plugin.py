"""pytest plugin of the reach run: the Triton variants the session compiled and the conditions its cases made matter.

Loaded with ``-p moegate.reach.plugin`` by ``python -m moegate.reach run`` only (never in CI): when
``MOEGATE_REACH_OUT`` names a folder, it records for the whole session every Triton kernel variant
compiled in this process (``moegate.reach.specialisations.record``) and, for every kernel-tier call
checked against the reference, which conditions mattered (``moegate.kernels.conditions.Tally``, as a
``moegate.kernels.check.OBSERVERS`` entry). At the end it writes ``session.json`` there: the device,
the Triton release, both records and any error met while recording.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
from pathlib import Path
from typing import Any

from moegate.reach import layout
from moegate.reach.specialisations import record

ENV = "MOEGATE_REACH_OUT"
SESSION = "session.json"

_state: dict[str, Any] = {}


def _device() -> str:
    try:
        import torch  # the vLLM environment's; the plugin runs in no other
    except ImportError:
        return f"cpu ({platform.machine()})"
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.machine()})"


def _triton_version() -> str | None:
    try:
        import triton  # optional: a CPU build of vLLM may come without it
    except ImportError:
        return None
    return str(getattr(triton, "__version__", "unknown"))


def pytest_configure(config: Any) -> None:
    out = os.environ.get(ENV)
    if not out:
        return
    from moegate.kernels.check import OBSERVERS  # torch: present wherever this run's vLLM is
    from moegate.kernels.conditions import Tally  # torch, as above

    stack = contextlib.ExitStack()
    variants: list[Any] = []
    errors: list[str] = []
    root = layout.read().source.root
    hooked = stack.enter_context(record(variants, root, errors))
    tally = Tally()
    OBSERVERS.append(tally.observe)
    stack.callback(OBSERVERS.remove, tally.observe)
    _state.update(out=Path(out), stack=stack, variants=variants, errors=errors, tally=tally, hooked=hooked)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    if "out" not in _state:
        return
    _state["stack"].close()
    unique = {json.dumps(v.to_dict(), sort_keys=True) for v in _state["variants"]}
    record = {
        "device": _device(),
        "triton": _triton_version(),
        "hooked": _state["hooked"],
        "pytest_exit": int(exitstatus),
        "specialisations": [json.loads(v) for v in sorted(unique)],
        "specialisation_errors": _state["errors"],
        "conditions": _state["tally"].to_dict(),
    }
    out: Path = _state["out"]
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (SESSION + ".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    tmp.replace(out / SESSION)
    _state.clear()
