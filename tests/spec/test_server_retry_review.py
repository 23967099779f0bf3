"""Review of retries against inference servers: a generation that was sent and got no answer in time is
not sent again (the server may still be running it), and SGLang's settings are not silently dropped
when the server is still starting."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drafter_lab import httpjson
from drafter_lab.errors import LabError
from drafter_lab.spec import served


@pytest.fixture
def silent(raw_server):
    """(base URL, requests it got): a server that reads each request and never answers."""
    return raw_server()


@pytest.fixture
def no_sleep(monkeypatch):
    """The retries' back-off, as a list of the seconds asked for."""
    slept: list[float] = []
    monkeypatch.setattr(httpjson.time, "sleep", slept.append)
    return slept


def test_a_generation_that_got_no_answer_is_not_sent_again(silent, no_sleep):
    """A server that accepted the request and went silent (busy on another one) got it 1 + retries times,
    each a generation of its own, and the client waited (retries + 1) x timeout_s plus the back-off (with
    the defaults ~40 minutes) before `cannot reach the server`."""
    url, got = silent
    with pytest.raises(LabError, match=rf"^{url}/v1/chat/completions: no answer within 0.2 s; not sent again"):
        httpjson.request_json(url + "/v1/chat/completions", {"messages": []}, timeout_s=0.2, retries=3)
    assert len(got) == 1 and got[0].startswith(b"POST ")
    with pytest.raises(LabError, match=rf"^{url}/generate: no answer within 0.2 s; not sent again"):
        list(httpjson.stream_json(url + "/generate", {"stream": True}, timeout_s=0.2, retries=3))
    assert len(got) == 2 and no_sleep == []


def test_a_silent_get_is_still_retried_and_a_refused_post_too(silent, no_sleep):
    """A GET (/v1/models, /metrics, /get_server_info) is safe to send again; a POST whose connection was
    refused never reached the server."""
    url, got = silent
    with pytest.raises(LabError, match=rf"^{url}/metrics: no answer within 0.2 s, 3 tries$"):
        httpjson.request_text(url + "/metrics", timeout_s=0.2, retries=2)
    assert len(got) == 3 and all(g.startswith(b"GET ") for g in got) and no_sleep == [1, 2]
    sent: list[float] = []
    closed = "http://127.0.0.1:9/generate"  # the discard port: nothing listens
    with pytest.raises(LabError, match=rf"^{closed}: cannot reach the server .* after 3 tries$"):
        list(httpjson.stream_json(closed, {}, timeout_s=0.2, retries=2, sent=sent))
    assert len(sent) == 3


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def _sglang(port: int, info_status: int) -> ThreadingHTTPServer:
    """An SGLang-like server on `port` whose /get_server_info answers `info_status`."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if info_status != 200:
                self.send_error(info_status)
                return
            body = json.dumps({"speculative_algorithm": "EAGLE3", "speculative_num_steps": 4,
                               "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 5, "tp_size": 1}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_sglang_settings_of_a_server_still_starting_are_not_dropped(monkeypatch):
    """The first try is refused (nothing listens yet), the server is up by the retry: settings() swallowed
    the refusal, and the eval's result silently had no steps, topk or draft_tokens."""
    port, servers = _free_port(), []
    monkeypatch.setattr(httpjson.time, "sleep", lambda s: servers.append(_sglang(port, 200)) if not servers else None)
    cfg = served.ServedConfig(url=f"http://127.0.0.1:{port}", timeout_s=5)
    try:
        assert served.SGLang(cfg.url, cfg).settings() == {
            "speculative_algorithm": "EAGLE3", "speculative_num_steps": 4, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 5}
    finally:
        for httpd in servers:
            httpd.shutdown()
            httpd.server_close()
    assert len(servers) == 1  # it was refused once


def test_sglang_settings_tolerate_only_a_missing_endpoint(no_sleep):
    """An older server without /get_server_info (404): the numbers stand without it. A server that cannot
    be reached, or fails, is a one-line error, not settings silently left out."""
    port = _free_port()
    cfg = served.ServedConfig(url=f"http://127.0.0.1:{port}", timeout_s=5, retries=2)
    with pytest.raises(LabError, match=rf"^{cfg.url}/get_server_info: cannot reach the server .* after 3 tries$"):
        served.SGLang(cfg.url, cfg).settings()
    for status, expected in ((404, {}), (500, "server answered HTTP 500")):
        httpd = _sglang(port, status)
        try:
            if isinstance(expected, dict):
                assert served.SGLang(cfg.url, cfg).settings() == expected
            else:
                with pytest.raises(LabError, match=expected):
                    served.SGLang(cfg.url, cfg).settings()
        finally:
            httpd.shutdown()
            httpd.server_close()
