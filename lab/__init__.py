"""Maintainer tooling kept apart from the library: the CI replay, GPU bring-up, probes."""
