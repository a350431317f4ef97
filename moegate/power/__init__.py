"""Gate power: mutation-test vLLM's fused-MoE dispatch code and measure how fast the suite kills each mutant.

A gate is only as good as the bugs it catches. This harness plants bugs in the
installed vLLM's dispatch code with cosmic-ray (an established mutation tool; no
mutation engine of our own), runs the dispatch tier against each mutant, and
reports killed / survived / timed-out mutants, the mutation score and, for each
killed mutant, the time to the first failing example. The installed vLLM is never
written: mutants live in a throw-away overlay, and ``tests/unit/power/test_overlay.py``
proves the installed files are unchanged after a run killed mid-mutant.

vLLM is text here: the harness parses and copies its files and never imports it
(``moegate.dispatch`` drives vLLM's dispatch); the names it looks for
come from ``moegate.dispatch.names``.

- ``regions``: what to mutate, found in vLLM's source by structure (``ast``).
- ``overlay``: the throw-away overlay, the frozen copy of the suite, stale work dirs.
- ``driver``: cosmic-ray: init, exec, the work items inside the regions, the results.
- ``outcome``: mutants, the run's outcome and score, the reviewed equivalents.
- ``summary_line``: the line each test run prints and the harness reads back.
- ``plugin``: the pytest plugin that prints it (``-p moegate.power.plugin``).
- ``run``: one run, stage by stage. ``report``: Markdown and JSON. ``cli``: the command line.
- ``errors``: the one-line errors.

Process trees by pid (stopping cosmic-ray and every test run it started): ``moegate.serve.processes``.

Run it through nox (``nox -s power``), or directly with the Python of an
environment that has cosmic-ray::

    python -m moegate.power --vllm-python /path/to/venv/bin/python

Nothing is imported here: the plugin is loaded into every mutant's test run and
must pull in nothing else.
"""
