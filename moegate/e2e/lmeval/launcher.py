"""lm-eval's own command line for a task that lives in ``--include_path`` alone: run by path in lm-eval's env.

``python -P launcher.py run ... --include_path DIR`` is ``python -m lm_eval run ...`` with one difference:
lm-eval builds its task index from DIR only (``TaskManager(include_defaults=False)``, lm-eval's own switch, which
its command line does not offer), not also from its 14,684 built-in task files, read on every start: most of an
lm-eval start's CPU time on the 2-core machine (results/ci-time.md, "Less CPU work"). The gate's local GSM8K task (``task.write_task_yaml``) is
self-contained YAML, so nothing of the built-in index is used; lm-eval's own ``gsm8k`` task still runs through
``python -m lm_eval``. Imports lm-eval and the standard library only: lm-eval's environment need not have moegate.
"""

from __future__ import annotations

import functools

from lm_eval.__main__ import cli_evaluate
from lm_eval.tasks import TaskManager


def main() -> None:
    TaskManager.__init__ = functools.partialmethod(TaskManager.__init__, include_defaults=False)
    cli_evaluate()


if __name__ == "__main__":
    main()
