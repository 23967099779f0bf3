"""Mutation review of httpjson's edges: which server URLs and timeouts the flags take, where a server's
message is cut, and what a rate limit's Retry-After makes the client wait."""

from __future__ import annotations

import argparse
import email.utils
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drafter_lab import httpjson
from drafter_lab.errors import LabError


@pytest.mark.parametrize("url", ["http://localhost:30000", "https://gpu-box.internal:8443", "https://10.0.0.5"])
def test_a_base_url_over_http_or_https_is_taken_as_given(url):
    """An engine behind TLS (a gateway, a cloud endpoint) is https: refusing it left no way to point at it."""
    assert httpjson.server_url(url) == url


@pytest.mark.parametrize("url", ["http://", "https://", "http:///generate", "ftp://localhost:30000"])
def test_a_url_with_no_host_or_another_scheme_is_refused(url):
    """`http://` with no host was urllib's `no host given` traceback, retried as a failed connection."""
    with pytest.raises(argparse.ArgumentTypeError, match="expected a base URL like http://localhost:30000"):
        httpjson.server_url(url)


def test_a_timeout_of_exactly_the_documented_maximum_is_taken():
    """--timeout's help and message say "at most 1e9": 1e9 itself is allowed, anything past it is not."""
    assert httpjson.timeout_arg("1e9") == 1e9
    assert httpjson.timeout_arg("0.001") == 0.001
    with pytest.raises(argparse.ArgumentTypeError):
        httpjson.timeout_arg("1000000001")


def test_a_server_message_of_exactly_the_limit_is_quoted_whole():
    """ONE_LINE_MAX characters fit; one more is cut to ONE_LINE_MAX, its last three "..."."""
    whole = "x" * httpjson.ONE_LINE_MAX
    assert httpjson._one_line(whole) == whole
    cut = httpjson._one_line(whole + "y")
    assert len(cut) == httpjson.ONE_LINE_MAX and cut == "x" * (httpjson.ONE_LINE_MAX - 3) + "..."


def test_retry_after_as_an_http_date_is_the_seconds_until_it(monkeypatch):
    """RFC 9110 allows a date as well as a count; a date passed, a negative count or nonsense is no wait,
    and a wait past RETRY_AFTER_MAX_S is cut to it."""
    now = 1_800_000_000.0
    monkeypatch.setattr(httpjson.time, "time", lambda: now)
    assert httpjson._retry_after(email.utils.formatdate(now + 30, usegmt=True)) == 30.0
    assert httpjson._retry_after(email.utils.formatdate(now - 30, usegmt=True)) == 0.0
    assert httpjson._retry_after(email.utils.formatdate(now + 3600, usegmt=True)) == httpjson.RETRY_AFTER_MAX_S
    for value in (None, "", "-5", "nan", "inf", "soon"):
        assert httpjson._retry_after(value) == 0.0, value
    assert httpjson._retry_after("2.5") == 2.5


@pytest.fixture
def limited(monkeypatch):
    """(base URL, replies, slept): each request pops the next (status, headers) of `replies` (200 answers
    {"ok": true}); time.sleep records the seconds asked for instead of sleeping."""
    replies: list[tuple[int, dict]] = []
    slept: list[float] = []
    monkeypatch.setattr(httpjson.time, "sleep", slept.append)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            status, headers = replies.pop(0)
            body = json.dumps({"ok": True} if status == 200 else {"error": "slow down"}).encode()
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", replies, slept
    httpd.shutdown()
    httpd.server_close()


def test_a_rate_limit_is_retried_as_long_as_retry_after_asks(limited):
    """A 429 is the one 4xx that a wait cures; its Retry-After, or a 503's, lengthens the back-off (never
    shortens it), and the last try's refusal is the one-line error."""
    url, replies, slept = limited
    replies += [(429, {"Retry-After": "7"}), (503, {"Retry-After": "0"}), (429, {}), (200, {})]
    assert httpjson.request_json(url + "/v1/completions", {"prompt": "x"}, retries=3) == {"ok": True}
    assert slept == [7.0, 2, 4] and replies == []
    replies += [(429, {})] * 2
    with pytest.raises(LabError, match=rf"^{url}/v1/completions: server answered HTTP 429: .*slow down"):
        httpjson.request_json(url + "/v1/completions", {"prompt": "x"}, retries=1)
    assert replies == []


def test_an_always_streaming_answer_that_starts_with_a_blank_line_is_named_as_a_stream(limited, monkeypatch):
    """The advice to point --server at the engine holds for a stream whose first event follows a blank line."""
    url, _, _ = limited
    monkeypatch.setattr(httpjson, "_open", lambda *a, **k: b'\r\ndata: {"n": 1}\n\ndata: [DONE]\n\n')
    with pytest.raises(LabError, match="server answered a stream of server-sent events, not JSON"):
        httpjson.request_json(url + "/generate", {"text": "x"})


def test_metrics_text_that_is_not_utf8_is_read_not_a_traceback(monkeypatch):
    """A /metrics page with a Latin-1 label value: the counters around it still read."""
    monkeypatch.setattr(httpjson, "_open", lambda *a, **k: b'vllm:x{model="caf\xe9"} 3.0\n')
    assert httpjson.request_text("http://127.0.0.1:9/metrics") == 'vllm:x{model="caf\ufffd"} 3.0\n'


def test_a_stream_that_stalls_after_it_began_is_one_line_and_not_sent_again(raw_server):
    """The server sent an event, then nothing for longer than the timeout (a hung engine): a TimeoutError
    traceback, where a stream that broke off is one line."""
    base, got = raw_server(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" b'data: {"n": 1}\n\n')
    url = base + "/generate"
    events = []
    with pytest.raises(LabError, match=rf"^{url}: the stream broke off \("):
        for _, event in httpjson.stream_json(url, {"stream": True}, timeout_s=0.3, retries=3):
            events.append(event)
    assert events == [{"n": 1}] and len(got) == 1


@pytest.mark.parametrize("first", [b": ping\n\n", b"event: message\n", b"id: 1\n", b"retry: 3000\n"])
def test_an_always_streaming_answer_that_opens_with_another_sse_field_is_named_as_a_stream(limited, monkeypatch, first):
    """A stream's keep-alive comment or event line ahead of its first `data:` (a proxy's keep-alive
    `: ping`): the advice to point --server at the engine, not "not JSON"."""
    url, _, _ = limited
    monkeypatch.setattr(httpjson, "_open", lambda *a, **k: first + b'data: {"n": 1}\n\ndata: [DONE]\n\n')
    with pytest.raises(LabError, match="server answered a stream of server-sent events, not JSON"):
        httpjson.request_json(url + "/generate", {"text": "x"})


@pytest.mark.parametrize("url", ["http://localhost:99999", "http://localhost:x", "https://[::1]:65536/v1"])
def test_a_server_url_whose_port_is_no_port_is_refused_as_a_flag(url):
    """Refused where the flag is read, not after a model loaded as "cannot reach the server (InvalidURL)"."""
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected a base URL like .*\(Port"):
        httpjson.server_url(url)
    assert httpjson.server_url("http://localhost:65535") == "http://localhost:65535"
