"""The few HTTP calls the gates make to a vLLM OpenAI server, with the standard library only."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from typing import Any


class RequestError(RuntimeError):
    pass


def post(url: str, body: dict[str, Any], timeout_s: float = 900) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # loopback only
            out: dict[str, Any] = json.load(resp)
            return out
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise RequestError(f"{url}: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        raise RequestError(f"{url}: {exc}") from None
    except (http.client.HTTPException, ValueError) as exc:  # a server killed mid-answer: cut short, or not JSON
        raise RequestError(f"{url}: the answer was cut short or unreadable ({type(exc).__name__}: {exc})") from None
