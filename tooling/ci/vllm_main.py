"""The nightly run against vLLM's main branch (``.github/workflows/vllm-main.yml``): which wheel, and what came of it.

    python -m tooling.ci.vllm_main wheel [--given URL] [--index URL]     # url=<main's newest nightly wheel>
    python -m tooling.ci.vllm_main fit --json reports/fit.json --exit N  # fits=true|false, with its lines

vLLM publishes a wheel for every commit of main (https://wheels.vllm.ai, the ``nightly`` index: a PEP 503 page per
project). ``wheel`` reads that page and takes the newest x86_64 wheel of the default CUDA build (no ``+cpu``, no
ROCm); ``--given`` passes a wheel URL through (a dispatched run's choice). ``fit`` turns ``nox -s fit``'s result
(``python -m moegate.census.fit``: does every module and name moegate drives still exist, does the census read it)
into the job's output. An environment that could not be built, so that the probe never ran, reads as not fitting
too, with its cause: moegate's pins no longer install vLLM's main branch, which is upkeep as well.

Three outcomes, told apart: PASS (it fits and the gate passes), FAIL (it fits and the gate fails: a bug in vLLM's
main branch, or a change the spec has to learn), and "moegate no longer fits this vLLM" (upkeep, before any case).
Standard library only. Exit status 0; 2 with one line where no wheel is found.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

NIGHTLY_INDEX = "https://wheels.vllm.ai/nightly/vllm/"
HREF = re.compile(r'href="([^"]+\.whl)(?:#[^"]*)?"')
WHEEL = re.compile(r"^vllm-(?P<version>[^-]+)-[^-]+-[^-]+-(?P<platform>[^-]+)\.whl$")


class MainError(ValueError):
    """One line, exit 2."""


def _version_key(version: str) -> tuple[tuple[int, ...], int]:
    """``0.34.0rc1.dev123+gabc.cu130`` -> ((0, 34, 0, 1), 123): the release, then the commits after it."""
    release = tuple(int(n) for n in re.findall(r"\d+", version.split(".dev")[0].split("+")[0]))
    dev = re.search(r"\.dev(\d+)", version)
    return release, int(dev.group(1)) if dev else 0


def newest_wheel(page: str, base: str) -> str:
    """The newest default-CUDA x86_64 wheel linked from a PEP 503 page, as an absolute URL."""
    found = []
    for href in HREF.findall(page):
        name = urllib.parse.unquote(href.rsplit("/", 1)[-1])
        m = WHEEL.match(name)
        if not m or "x86_64" not in m.group("platform") or re.search(r"\+(.*\.)?(cpu|rocm)", m.group("version")):
            continue
        found.append((_version_key(m.group("version")), urllib.parse.urljoin(base, href)))
    if not found:
        raise MainError(f"{base}: no x86_64 CUDA wheel of vLLM linked there")
    return max(found)[1]


def fetch(url: str, timeout: float = 30) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return str(resp.read().decode("utf-8", errors="replace"))
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise MainError(f"{url}: cannot read vLLM's nightly index ({getattr(exc, 'reason', exc)})") from None


def fit_outcome(report: Path, exit_status: int) -> dict[str, str]:
    """``fits`` and one line saying why, from ``python -m moegate.census.fit --json``'s file and ``nox -s fit``'s exit."""
    try:
        data = json.loads(report.read_text())
    except (OSError, json.JSONDecodeError):
        return {"fits": "false", "why": f"the probe never ran (nox -s fit exit {exit_status}): vLLM main did not "
                "install into moegate's environment (see the fit job's log)"}  # fmt: skip
    if data.get("fits") and exit_status == 0:
        return {"fits": "true", "why": f"moegate fits vLLM {data.get('version')}: {'; '.join(data.get('checked', []))}"}
    moved = "; ".join(data.get("moved") or [f"exit {exit_status}"])
    return {"fits": "false", "why": f"moegate no longer fits vLLM {data.get('version')}: {moved}"}


def _output(values: dict[str, str]) -> None:
    lines = [f"{k}={v}" for k, v in values.items()]
    print("\n".join(lines))
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tooling.ci.vllm_main", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wheel")
    w.add_argument("--given", default="", help="a wheel URL to take as it is")
    w.add_argument("--index", default=NIGHTLY_INDEX, help="the nightly index's vllm page")
    f = sub.add_parser("fit")
    f.add_argument("--json", type=Path, required=True)
    f.add_argument("--exit", type=int, required=True, dest="exit_status")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "wheel":
            url = args.given.strip() or newest_wheel(fetch(args.index), args.index)
            if not url.startswith("https://") or not url.endswith(".whl"):
                raise MainError(f"{url!r} is not an https:// URL of a wheel")
            _output({"url": url})
        else:
            _output(fit_outcome(args.json, args.exit_status))
    except MainError as exc:
        print(f"moegate: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
