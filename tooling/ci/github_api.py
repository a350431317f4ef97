"""The few GitHub REST calls the verdict makes, over urllib (the runner's Python, nothing installed).

``GITHUB_API_URL`` (set on every runner; the replay points it at a local stand-in) is the base, ``GITHUB_TOKEN`` the
token. Every failure is one line (``ApiError``) naming the call and GitHub's answer.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

PER_PAGE = 100
MAX_PAGES = 30


class ApiError(RuntimeError):
    """A call that failed: one line."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Api:
    def __init__(self, base: str | None = None, token: str | None = None, timeout: float = 30) -> None:
        self.base = (base or os.environ.get("GITHUB_API_URL") or "https://api.github.com").rstrip("/")
        self.token = token if token is not None else os.environ.get("GITHUB_TOKEN", "")
        self.timeout = timeout

    def _request(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None,
                 accept: str = "application/vnd.github+json") -> bytes:  # fmt: skip
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        headers = {"Accept": accept, "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "moegate-verdict"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:200].replace("\n", " ")
            raise ApiError(f"{method} {path}: HTTP {exc.code} {detail}".rstrip(), exc.code) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise ApiError(f"{method} {path}: {getattr(exc, 'reason', exc)}") from None

    def get(self, path: str, **params: Any) -> Any:
        raw = self._request("GET", path, params or None)
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise ApiError(f"GET {path}: the answer is not JSON") from None

    def raw(self, path: str, ref: str) -> str:
        """A file's bytes at ``ref`` (``GET /repos/R/contents/P?ref=``, raw), as text."""
        return self._request("GET", path, {"ref": ref}, accept="application/vnd.github.raw").decode("utf-8")

    def pages(self, path: str, key: str | None = None, **params: Any) -> list[Any]:
        """Every item of a listed resource (``key``: the list's field in each page, for the wrapped ones)."""
        items: list[Any] = []
        for page in range(1, MAX_PAGES + 1):
            got = self.get(path, **params, per_page=PER_PAGE, page=page)
            chunk = got.get(key, []) if key else got
            if not isinstance(chunk, list):
                raise ApiError(f"GET {path}: no list{f' {key!r}' if key else ''} in the answer")
            items += chunk
            if len(chunk) < PER_PAGE:
                break
        return items

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return json.loads(self._request("POST", path, body=body) or b"{}")
