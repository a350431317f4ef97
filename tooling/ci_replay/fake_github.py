"""A local stand-in for the GitHub REST calls the verdict makes (``tooling/ci/github_api.py``), over a real git repository.

The verdict's replay (``verdict_replay.py``) and its unit tests point ``GITHUB_API_URL`` here. Files, merge bases
and changed files come from the scenario's git repository (``git show``, ``git merge-base``, ``git diff -M``), as
GitHub computes them from the pushed commits; the pull request, the run's jobs, the label's events, the actors'
permissions and the caller's earlier runs are the scenario's data, which on GitHub only GitHub writes. Every status
posted is kept (``statuses``) for the replay to read back.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Scenario:
    repo: str
    git: Path
    pr: dict[str, Any]
    jobs: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    permissions: dict[str, str] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    """Every call, ``METHOD /path``, and the token it came with (``tokens``, same order)."""
    tokens: list[str] = field(default_factory=list)


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)


def compare(repo: Path, base: str, head: str) -> dict[str, Any] | None:
    """``GET compare/BASE...HEAD``: the merge base and the files changed since it (renames with their old name)."""
    mb = _git(repo, "merge-base", base, head)
    if mb.returncode:
        return None
    merge_base = mb.stdout.strip()
    files = []
    for line in _git(repo, "diff", "--name-status", "-M", merge_base, head).stdout.splitlines():
        status, *paths = line.split("\t")
        rec: dict[str, Any] = {
            "filename": paths[-1],
            "status": {"R": "renamed", "A": "added", "D": "removed"}.get(status[0], "modified"),
        }
        if status.startswith("R"):
            rec["previous_filename"] = paths[0]
        files.append(rec)
    return {"merge_base_commit": {"sha": merge_base}, "files": files}


ROUTES = [
    ("GET", re.compile(r"^/repos/(?P<r>[^/]+/[^/]+)/compare/(?P<base>.+)\.\.\.(?P<head>[^/]+)$"), "compare"),
    ("GET", re.compile(r"^/repos/(?P<r>[^/]+/[^/]+)/contents/(?P<path>.+)$"), "contents"),
    ("GET", re.compile(r"^/repos/(?P<r>[^/]+/[^/]+)/pulls/(?P<n>\d+)$"), "pull"),
    ("GET", re.compile(r"^/repos/(?P<r>[^/]+/[^/]+)/pulls$"), "pulls"),
    ("GET", re.compile(r"^/repos/(?P<r>[^/]+/[^/]+)/actions/runs/\d+/attempts/\d+/jobs$"), "jobs"),
    ("GET", re.compile(r"^/repos/(?P<r>[^/]+/[^/]+)/issues/\d+/events$"), "events"),
    ("GET", re.compile(r"^/repos/(?P<r>[^/]+/[^/]+)/collaborators/(?P<user>[^/]+)/permission$"), "permission"),
    ("GET", re.compile(r"^/repos/(?P<r>[^/]+/[^/]+)/actions/workflows/[^/]+/runs$"), "runs"),
    ("POST", re.compile(r"^/repos/(?P<r>[^/]+/[^/]+)/statuses/(?P<sha>[0-9a-f]{40})$"), "status"),
]


def answer(sc: Scenario, method: str, path: str, query: dict[str, str], body: Any, token: str = "") -> tuple[int, Any]:
    """(HTTP status, JSON or text) for one call; 404 for anything GitHub would not find."""
    sc.calls.append(f"{method} {path}")
    sc.tokens.append(token)
    for verb, pattern, name in ROUTES:
        m = pattern.match(path)
        if verb != method or m is None:
            continue
        if m.group("r") != sc.repo:
            return 404, {"message": "Not Found"}
        page = int(query.get("page", "1"))
        if name == "compare":
            got = compare(sc.git, m.group("base"), m.group("head"))
            return (200, got) if got else (404, {"message": "No common ancestor"})
        if name == "contents":
            shown = _git(sc.git, "show", f"{query.get('ref', 'HEAD')}:{m.group('path')}")
            return (200, shown.stdout) if shown.returncode == 0 else (404, {"message": "Not Found"})
        if name == "pull":
            return (200, sc.pr) if int(m.group("n")) == sc.pr["number"] else (404, {"message": "Not Found"})
        if name == "pulls":
            return 200, [sc.pr] if page == 1 else []
        if name == "jobs":
            return 200, {"total_count": len(sc.jobs), "jobs": sc.jobs if page == 1 else []}
        if name == "events":
            return 200, sc.events if page == 1 else []
        if name == "permission":
            return 200, {"permission": sc.permissions.get(m.group("user"), "none")}
        if name == "runs":
            return 200, {"total_count": len(sc.runs), "workflow_runs": sc.runs if page == 1 else []}
        if name == "status":
            sc.statuses.append({"sha": m.group("sha"), **(body or {})})
            return 201, {"state": (body or {}).get("state")}
    return 404, {"message": "Not Found"}


class Server:
    """``with Server(scenario) as url:`` a GitHub API stand-in at ``url`` (loopback, a free port) for the block."""

    def __init__(self, scenario: Scenario, port: int = 0) -> None:
        self.scenario = scenario
        sc = scenario

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                status, data = answer(sc, method, url.path, query, body, token)
                raw = data.encode() if isinstance(data, str) else json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(data, str) else "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self._reply("GET")

            def do_POST(self) -> None:
                self._reply("POST")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> str:
        self.thread.start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
