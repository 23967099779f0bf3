"""JSON (and Prometheus text) over HTTP from a serving engine (SGLang, vLLM), with retries, and
failures as one line.

Connection errors, 5xx and 429 answers are retried 1, 2, 4, ... s apart (a server under load or
still starting, a gateway's rate limit), or as far apart as their Retry-After asks, up to a minute;
other 4xx answers and non-JSON bodies are not, nor is a POST that was sent and then got no answer
within the timeout: the server may still be generating it, and a retry would generate it again (a
silent GET is retried). A streamed answer (server-sent events, as SGLang's and vLLM's
`"stream": true` send) is retried only until it starts: a stream that breaks off would otherwise be
decoded twice. What retries do not cure is a LabError that names the URL.
"""

from __future__ import annotations

import argparse
import email.utils
import http.client
import itertools
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

from drafter_lab.errors import LabError


class HTTPStatusError(LabError):
    """The server answered an error status, kept in `status` (a 404: an endpoint an older server lacks)."""

    def __init__(self, status: int, detail: str, url: str):
        super().__init__(f"server answered HTTP {status}: {detail}", url)
        self.status = status


def url_problem(text: str) -> str | None:
    """Why `text` is no server's base URL (None: it is one): a scheme-less "localhost:30000" would otherwise
    be retried as an unknown URL type, and an empty or bare word, a port out of range, or an unclosed IPv6
    bracket, be urllib's traceback. A space or control character (`http://a b:30000`) urlsplit takes, but
    http.client refuses every request to it, retried as a server it "cannot reach"."""
    expected = f"expected a base URL like http://localhost:30000, got {text!r}"
    if any(c.isspace() or not c.isprintable() for c in text):
        return f"{expected} (a space or control character in it)"
    try:
        parts = urllib.parse.urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            return expected
        parts.port  # noqa: B018 -- urllib checks the port only when it is read
    except ValueError as e:  # an unclosed IPv6 bracket; a port out of range, or not a number
        return f"{expected} ({e})"
    return None


def server_url(text: str) -> str:
    """argparse type of a server's base URL (`url_problem`)."""
    if problem := url_problem(text):
        raise argparse.ArgumentTypeError(problem)
    return text


def timeout_arg(text: str) -> float:
    """argparse type of --timeout: positive seconds, at most 1e9 (a socket takes 0 for non-blocking, and
    a negative, NaN or larger one fails with a traceback)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not _is_timeout(seconds):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds (at most 1e9), got {text!r}")
    return seconds


def _is_timeout(seconds) -> bool:
    return not isinstance(seconds, bool) and isinstance(seconds, int | float) and 0 < seconds <= 1e9


def check_timeout(seconds) -> None:
    """A library caller's timeout_s, as --timeout checks it: 0 (non-blocking) failed every read with a
    socket error, after the connection was made."""
    if not _is_timeout(seconds):
        raise LabError(f"timeout_s must be a positive number of seconds (at most 1e9), got {seconds!r}")


def add_client_args(parser) -> None:
    """`--retries` and `--timeout`, the same for every command that talks to a server (--server)."""
    parser.add_argument("--retries", type=int, default=None, metavar="N",
                        help="with --server: retries of a request that failed to connect or got a 5xx or 429 answer "
                             "(1, 2, 4, ... s apart, or as its Retry-After asks; default 3)")
    parser.add_argument("--timeout", type=timeout_arg, default=None, metavar="SECONDS",
                        help="with --server: seconds to wait for each read from a server (default 600); a generation "
                             "not answered within them is not sent again, as the server may still be running it")


ONE_LINE_MAX = 500
"""The longest server message an error quotes: vLLM's context-length refusal, advice at its end, fits."""


def _one_line(text: str) -> str:
    """A server's message, for a one-line error: every run of whitespace (an nginx page's CRLFs too,
    whose CRs would otherwise overwrite the line on a terminal) one space, and at most ONE_LINE_MAX
    characters, ending "..." where cut."""
    text = " ".join(text.split())
    return text if len(text) <= ONE_LINE_MAX else text[:ONE_LINE_MAX - 3] + "..."


def _retry_after(value: str | None) -> float:
    """The seconds a Retry-After header asks for (a count, or an HTTP date), at most RETRY_AFTER_MAX_S;
    0 for none."""
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return 0.0
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S) if math.isfinite(seconds) else 0.0


RETRY_AFTER_MAX_S = 60.0
"""The longest wait a Retry-After gets: past it the try is made anyway, as a silent wait reads as a hang."""


def _open(url: str, data: bytes | None, timeout_s: float, retries: int, whole: bool = False,
          sent: list[float] | None = None):
    """The open response (to be closed by the caller), once the server answered 2xx; `whole`: its body,
    read within the tries (a body cut short or stalled fails that try, as a refused connection does).
    `sent`: time.perf_counter() as each try is sent is appended to it."""
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    for attempt in itertools.count():
        pause = 2**attempt
        if sent is not None:
            sent.append(time.perf_counter())
        try:
            r = urllib.request.urlopen(request, timeout=timeout_s)
            if not whole:
                return r
            with r:
                return r.read()
        except urllib.error.HTTPError as e:
            try:
                detail = _one_line(e.read().decode(errors="replace"))
            except (http.client.HTTPException, OSError):  # its body cut short or stalled: the status still stands
                detail = "(its body broke off)"
            if (e.code < 500 and e.code != 429) or attempt == retries:
                raise HTTPStatusError(e.code, detail, url) from None
            pause = max(pause, _retry_after(e.headers.get("Retry-After")))
        except TimeoutError:  # sent, then silent (urllib wraps a connect timeout in a URLError)
            if data is not None:
                raise LabError(f"no answer within {timeout_s:g} s; not sent again, as the server may still be "
                               "generating it", url) from None
            if attempt == retries:
                raise LabError(f"no answer within {timeout_s:g} s, {retries + 1} tries", url) from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError) as e:
            if attempt == retries:
                reason = getattr(e, "reason", None) or repr(e)
                raise LabError(f"cannot reach the server ({reason}) after {retries + 1} tries", url) from None
        time.sleep(pause)


_SSE_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")


def request_json(url: str, body: dict | None = None, *, timeout_s: float = 600.0, retries: int = 3):
    """POST `body` as JSON to `url` (GET without one); returns the decoded answer."""
    raw = _open(url, None if body is None else json.dumps(body).encode(), timeout_s, retries, whole=True)
    try:
        return json.loads(raw)
    except ValueError:  # not JSON, or not UTF-8 (a proxy's Latin-1 page)
        # a gateway or server that always streams: its first line an SSE field (a keep-alive comment
        # `: ping` or an `event:` line may come ahead of the first `data:`)
        if raw.lstrip().startswith(_SSE_FIELDS):
            raise LabError('server answered a stream of server-sent events, not JSON: it (or a proxy before it) '
                           'ignores "stream": false; point --server at the engine itself', url) from None
        raise LabError("server answer is not JSON", url) from None


def request_text(url: str, *, timeout_s: float = 600.0, retries: int = 3) -> str:
    """GET `url` as text (e.g. Prometheus /metrics)."""
    return _open(url, None, timeout_s, retries, whole=True).decode(errors="replace")


def stream_json(url: str, body: dict, *, timeout_s: float = 600.0, retries: int = 3,
                sent: list[float] | None = None) -> Iterator[tuple[float, object]]:
    """POST `body` and yield (time.perf_counter() at its arrival, decoded JSON) for each server-sent
    event's `data:` line, until `data: [DONE]`, which SGLang and vLLM send last. An event that
    carries an error (how they report a failure after the stream began) or is not JSON, an answer
    with no events, and a stream that ends before [DONE] or stalls past `timeout_s`, are a LabError.
    `sent` gets time.perf_counter() as each try is sent, by the first event: the last is the try
    that was answered (a time to first token counts from it, not from the retries and their waits)."""
    events = 0
    with _open(url, json.dumps(body).encode(), timeout_s, retries, sent=sent) as r:
        try:
            for raw in r:
                line = raw.strip()
                if not line.startswith(b"data:"):  # blank separators, comments, event names
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                try:
                    event = json.loads(data)
                except ValueError:  # not JSON, or not UTF-8
                    raise LabError(f"server sent an event that is not JSON: {_one_line(data.decode(errors='replace'))}",
                                   url) from None
                if isinstance(event, dict) and (event.get("error") or event.get("object") == "error"):
                    detail = event.get("error") or event.get("message")
                    raise LabError(f"server reported an error mid-stream: {_one_line(str(detail))}", url)
                events += 1
                yield time.perf_counter(), event
        except (http.client.HTTPException, ConnectionError, TimeoutError) as e:
            raise LabError(f"the stream broke off ({e or type(e).__name__})", url) from None
    if not events:
        raise LabError('the answer is not a stream of server-sent events (no `data:` lines): does the server '
                       'ignore "stream": true?', url)
    raise LabError("the stream ended before `data: [DONE]`", url)
