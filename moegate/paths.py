"""Where moegate's files are: one place, the same whether moegate runs installed or from a checkout.

The project's data belongs to a checkout of the repository, never to an installed
package: the goldens (``golden/``, rewritten only by the bless command), the e2e
prompt set, the reviewed equivalent mutants (``power/``), the measured figures
(``results/``) and what a run writes (``reports/``). The checkout is, in order:

1. ``$MOEGATE_ROOT``, when set: an installed moegate pointed at a checkout;
2. the checkout this package sits in (``moegate/`` beside a ``pyproject.toml``
   naming the project): an editable install, or a run from the checkout;
3. the current directory: an installed wheel run from a checkout's root.

GSM8K is never in the checkout: it is read from ``$MOEGATE_GSM8K_DIR``, else from the folder
``moegate fetch-gsm8k`` fills (``GSM8K_CACHE_DIR``; ``moegate.e2e.gsm8k_files``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT_ENV = "MOEGATE_ROOT"
PACKAGE_DIR = Path(__file__).resolve().parent


def is_checkout(folder: Path) -> bool:
    """``folder`` holds moegate's own ``pyproject.toml`` and its ``moegate/`` package."""
    pyproject = folder / "pyproject.toml"
    if not (pyproject.is_file() and (folder / "moegate" / "__init__.py").is_file()):
        return False
    return 'name = "moegate"' in pyproject.read_text(encoding="utf-8")


def find_root(env: Mapping[str, str] = os.environ, package_dir: Path = PACKAGE_DIR, cwd: Path | None = None) -> Path:
    """The checkout the data paths are read from (the module docstring's three rules, in order)."""
    if env.get(ROOT_ENV):
        return Path(env[ROOT_ENV]).expanduser().resolve()
    if is_checkout(package_dir.parent):
        return package_dir.parent
    return (cwd or Path.cwd()).resolve()


ROOT = find_root()
GOLDEN_DIR = ROOT / "golden"
"""Golden files; ``golden/e2e`` holds the e2e tier's (and its frozen prompt set)."""
REPORTS_DIR = ROOT / "reports"
"""What runs write (ignored by git): report pages, JUnit files, raw results."""
RESULTS_DIR = ROOT / "results"
"""Measured figures, each with the command that produced it (committed)."""
EQUIVALENT_MUTANTS = ROOT / "power" / "equivalent-mutants.toml"
"""The reviewed equivalent mutants of ``nox -s power``."""
MODELS_DIR = ROOT / "models"
"""Checkpoints committed with their provenance (the trained tiny model)."""
ENVS_DIR = Path(os.environ["MOEGATE_ENV_DIR"]).expanduser() if os.environ.get("MOEGATE_ENV_DIR") else ROOT / ".nox"
"""The environments nox builds (``_eval`` is lm-eval's): ``$MOEGATE_ENV_DIR`` or the checkout's ``.nox``
(tooling/nox_envs.py, ``env_root``)."""
GSM8K_ENV = "MOEGATE_GSM8K_DIR"
GSM8K_CACHE_DIR = Path("~/.cache/moegate/gsm8k").expanduser()
"""Where ``moegate fetch-gsm8k`` puts GSM8K unless told otherwise, and so where the tiers look when
``$MOEGATE_GSM8K_DIR`` is not set."""
