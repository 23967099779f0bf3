"""JSON (and Prometheus text) over HTTP from a serving engine (SGLang, vLLM), with retries, and
failures as one line.

Connection errors and 5xx answers are retried 1, 2, 4, ... s apart (a server under load or still
starting); 4xx answers and non-JSON bodies are not. What retries do not cure is a LabError that
names the URL.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.error
import urllib.request

from drafter_lab.errors import LabError


def _request(url: str, data: bytes | None, timeout_s: float, retries: int) -> bytes:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    for attempt in itertools.count():
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as r:
                return r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace").strip().replace("\n", " ")[:200]
            if e.code < 500 or attempt == retries:
                raise LabError(f"server answered HTTP {e.code}: {detail}", url) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            if attempt == retries:
                reason = getattr(e, "reason", e)
                raise LabError(f"cannot reach the server ({reason}) after {retries + 1} tries", url) from None
        time.sleep(2**attempt)


def request_json(url: str, body: dict | None = None, *, timeout_s: float = 600.0, retries: int = 3):
    """POST `body` as JSON to `url` (GET without one); returns the decoded answer."""
    raw = _request(url, None if body is None else json.dumps(body).encode(), timeout_s, retries)
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        raise LabError("server answer is not JSON", url) from None


def request_text(url: str, *, timeout_s: float = 600.0, retries: int = 3) -> str:
    """GET `url` as text (e.g. Prometheus /metrics)."""
    return _request(url, None, timeout_s, retries).decode(errors="replace")
