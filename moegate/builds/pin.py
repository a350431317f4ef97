"""Pin vLLM's precompiled build to one named wheel: the merge base's, never what git state makes of it.

vLLM 0.33.0's ``setup.py`` (``precompiled_wheel_utils.determine_wheel_url``), with ``VLLM_USE_PRECOMPILED=1``,
takes its compiled extensions from, in order:

1. ``VLLM_PRECOMPILED_WHEEL_LOCATION``: a wheel's path or URL, used as given;
2. else ``https://wheels.vllm.ai/<commit>/<variant>/vllm/metadata.json``, where ``<commit>`` is
   ``VLLM_PRECOMPILED_WHEEL_COMMIT`` when it is 40 characters, and otherwise the merge base of ``HEAD`` with
   upstream main's newest commit (asked of api.github.com), searched up to 20 commits back for one that has a
   published wheel (``find_published_wheel_commit``), or ``nightly`` when that lookup fails; ``<variant>`` is
   ``VLLM_PRECOMPILED_WHEEL_VARIANT``, else detected from torch or nvidia-smi.

So an unpinned build on a fork's detached checkout takes whatever upstream main is at that minute. ``pin`` names the
wheel instead: it checks that the tree's ``setup.py`` reads ``VLLM_PRECOMPILED_WHEEL_LOCATION`` (a vLLM that does
not cannot be pinned), resolves the commit to a full SHA, reads the commit's published metadata and returns the
exact wheel's URL, for both builds of a pull request; with ``search``, the nearest older first-parent commit's wheel
where no compiled source changed between the two (as vLLM's own search does, with moegate's reading of what is
compiled). Every failure is one line (``PinError``).
"""

from __future__ import annotations

import json
import platform
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

from moegate.builds.changes import ChangesError, compiled_changes, resolve

INDEX = "https://wheels.vllm.ai"
LOCATION_VAR = "VLLM_PRECOMPILED_WHEEL_LOCATION"
COMMIT_VAR = "VLLM_PRECOMPILED_WHEEL_COMMIT"
VARIANT_VAR = "VLLM_PRECOMPILED_WHEEL_VARIANT"
TIMEOUT_S = 30


class PinError(ValueError):
    """A precompiled build that cannot be pinned: one line."""


@dataclass(frozen=True)
class Pin:
    commit: str
    """The commit whose published wheel both builds take their binaries from."""
    variant: str
    url: str
    """The one wheel both builds take their compiled extensions from."""
    merge_base: str = ""
    distance: int = 0
    """First-parent commits from the merge base back to ``commit`` (0: the merge base's own wheel)."""

    def env(self) -> dict[str, str]:
        return {LOCATION_VAR: self.url, COMMIT_VAR: self.commit, VARIANT_VAR: self.variant}


def honours(setup_py: str) -> list[str]:
    """The pinning variables a ``setup.py`` reads, of the three; the location one is what pins."""
    return [v for v in (LOCATION_VAR, COMMIT_VAR, VARIANT_VAR) if v in setup_py]


class _NotPublished(PinError):
    pass


def _wheel_url(index: str, sha: str, variant: str, arch: str) -> str:
    repo_url = f"{index.rstrip('/')}/{sha}/{variant}/vllm/"
    meta_url = repo_url + "metadata.json"
    try:
        with urllib.request.urlopen(meta_url, timeout=TIMEOUT_S) as resp:
            wheels = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise _NotPublished(
            f"no precompiled wheel published for {sha} ({variant}): {meta_url}: HTTP {exc.code}"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise _NotPublished(f"no precompiled wheel published for {sha} ({variant}): {meta_url}: {reason}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise PinError(f"{meta_url}: not a wheel index (not JSON)") from None
    for wheel in wheels if isinstance(wheels, list) else []:
        if isinstance(wheel, dict) and wheel.get("package_name") == "vllm" and arch in str(wheel.get("platform_tag")):
            if "path" not in wheel:
                raise PinError(f"{meta_url}: the {arch} wheel has no path")
            return urljoin(repo_url, str(wheel["path"]))
    raise _NotPublished(f"no precompiled {arch} wheel of vllm published for {sha} ({variant}): {meta_url}")


def pin(
    repo: str | Path, commit: str, variant: str, *, index: str = INDEX, arch: str | None = None, search: int = 0
) -> Pin:
    """The published wheel of ``commit`` (see the module's docstring); ``PinError`` where there is none to take.

    ``search`` > 0 walks that many first-parent commits back from ``commit`` (vLLM publishes main's wheels some
    commits late) and takes the nearest that has one, but only where no compiled source changed between it and
    ``commit`` (``moegate.builds.changes``): its binaries are then the ones ``commit``'s sources make."""
    setup = Path(repo, "setup.py")
    if not setup.is_file():
        raise PinError(f"{repo}: no setup.py: not a vLLM source tree")
    if LOCATION_VAR not in honours(setup.read_text(errors="replace")):
        raise PinError(f"{setup}: does not read {LOCATION_VAR}: this vLLM's precompiled build cannot be pinned")
    try:
        sha = resolve(repo, commit)
        candidates = _first_parents(repo, sha, search + 1)
    except ChangesError as exc:
        raise PinError(str(exc)) from None
    arch = arch or platform.machine()
    first: PinError | None = None
    for distance, candidate in enumerate(candidates):
        try:
            url = _wheel_url(index, candidate, variant, arch)
        except _NotPublished as exc:
            first = first or exc
            continue
        if distance:
            try:
                between = compiled_changes(repo, candidate, sha)
            except ChangesError as exc:
                raise PinError(str(exc)) from None
            if between.compiled:
                files = [c.path for c in between.moe] + list(between.other)
                raise PinError(
                    f"{first}; the nearest published wheel ({candidate}, {distance} commits older) was built from"
                    f" other compiled sources ({', '.join(files[:10])}{' ...' if len(files) > 10 else ''})"
                )
        return Pin(candidate, variant, url, sha, distance)
    assert first is not None
    if search:
        raise PinError(f"{first}, nor for the {len(candidates) - 1} commits before it")
    raise first


def _first_parents(repo: str | Path, sha: str, count: int) -> list[str]:
    r = subprocess.run(
        ["git", "-C", str(repo), "rev-list", "--first-parent", f"--max-count={count}", sha],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if r.returncode != 0:
        raise ChangesError(f"{repo}: git rev-list {sha[:12]} failed")
    return r.stdout.split()
