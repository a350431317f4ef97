"""Builds: vLLM as an interpreter, from a wheel or a site; what runs inside one; which binaries a PR's builds hold.

- ``planted``: a build as a venv that sees a Python's packages and sites first, with a planted bug
  (``moegate make-build``).
- ``probe``: does vLLM import in a build's interpreter (a process of its own): ``moegate gate`` asks first.
- ``wheels``: is a wheel vLLM's, read from its METADATA before anything is installed.
- ``devsite``: a dev-versioned copy of an installed vLLM (``python -m moegate.builds.devsite``).
- ``bench_serve``: the in-process ``vllm bench serve`` runner the A/B tier starts inside each build.
- ``cmake``, ``sources``, ``changes``, ``extensions``, ``pin``, ``moe_build``: whether a PR's builds hold its
  compiled change (issue 44 items 1-2), read as files and bytes, never imported; ``moegate builds`` is their
  command line.
"""
