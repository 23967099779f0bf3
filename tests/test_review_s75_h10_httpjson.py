"""httpjson pins from the s75 (h10) mutation audit."""

from __future__ import annotations

import argparse
from http.server import BaseHTTPRequestHandler

import pytest

from drafter_lab import httpjson
from drafter_lab.errors import LabError
from drafter_lab.spec.served import ServedConfig, check_settings


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1:30000/v1"])
def test_a_url_with_an_unclosed_ipv6_bracket_is_refused_in_one_line(url):
    """urlsplit itself raises on it: argparse's "invalid server_url value", and a library caller's traceback."""
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a base URL like .*\(Invalid IPv6 URL\)$"):
        httpjson.server_url(url)
    with pytest.raises(LabError) as e:
        check_settings(ServedConfig(url=url))
    assert str(e.value) == f"{url}: expected a base URL like http://localhost:30000, got {url!r} (Invalid IPv6 URL)"
    assert httpjson.url_problem("http://[::1]:30000") is None


def test_a_retry_after_waits_up_to_a_minute():
    """The module's promise ("up to a minute"), not whatever RETRY_AFTER_MAX_S holds: a longer wait reads as a hang."""
    assert httpjson._retry_after("3600") == 60.0
    assert httpjson._retry_after("59.5") == 59.5


def test_an_error_status_whose_body_stalls_is_still_that_status_in_one_line(raw_server):
    """The status line came, then the body stalled past the timeout: the status stands, its body unquoted."""
    base, got = raw_server(b"HTTP/1.1 404 Not Found\r\nContent-Length: 100\r\n\r\nnot f")
    url = base + "/v1/models"
    with pytest.raises(httpjson.HTTPStatusError) as e:
        httpjson.request_json(url, timeout_s=0.3, retries=0)
    assert str(e.value) == f"{url}: server answered HTTP 404: (its body broke off)"
    assert e.value.status == 404 and len(got) == 1


@pytest.fixture
def unavailable(monkeypatch, http_server):
    """(base URL, requests it got): a server that answers every request 503; time.sleep does not sleep."""
    got: list[str] = []
    monkeypatch.setattr(httpjson.time, "sleep", lambda s: None)

    class Handler(BaseHTTPRequestHandler):
        def answer(self):
            got.append(self.command)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = answer

    return http_server(Handler), got


@pytest.mark.parametrize("call", [
    lambda url: httpjson.request_json(url, {"prompt": "x"}),
    lambda url: httpjson.request_text(url),
    lambda url: list(httpjson.stream_json(url, {"stream": True})),
], ids=["request_json", "request_text", "stream_json"])
def test_a_library_caller_gets_three_retries_by_default(unavailable, call):
    """As --retries documents ("default 3"): four tries in all, then the last answer's one line."""
    url, got = unavailable
    with pytest.raises(httpjson.HTTPStatusError, match="server answered HTTP 503"):
        call(url + "/v1/x")
    assert len(got) == 4


def test_a_stream_that_breaks_off_says_how(raw_server):
    """The error's own words (a stall's "timed out", a cut's bytes read), the type's name only where it has none."""
    base, _ = raw_server(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" b'data: {"n": 1}\n\n')
    url = base + "/generate"
    with pytest.raises(LabError) as e:
        list(httpjson.stream_json(url, {"stream": True}, timeout_s=0.3, retries=0))
    assert str(e.value) == f"{url}: the stream broke off (timed out)"
