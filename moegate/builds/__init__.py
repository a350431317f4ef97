"""Which binaries a vLLM pull request's builds hold, and whether they hold its compiled change (issue 44 items 1-2).

Nothing here imports vLLM: a vLLM tree is read as files (at a commit, through git, or in a folder), a build's
extensions as bytes. ``moegate builds`` (``moegate/cli/builds.py``) is the command line.
"""
