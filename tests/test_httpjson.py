"""The serving-engine client retries what a busy or starting server answers (5xx, refused
connections) and nothing else, and says what went wrong in one line naming the URL."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drafter_lab import httpjson
from drafter_lab.errors import LabError


@pytest.fixture
def server(monkeypatch):
    """(base URL, script): each request pops the next (status, body) of `script`, a body given as a
    list being sent in those chunks (HTTP/1.1 chunked, as uvicorn streams SGLang's and vLLM's
    events), one given as (length, bytes) cut short (the length announced, the bytes sent, the
    connection closed); retries do not sleep."""
    monkeypatch.setattr(httpjson.time, "sleep", lambda s: None)
    script: list[tuple[int, bytes | list[bytes]]] = []
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self):
            seen.append(self.command)
            status, body = script.pop(0)
            self.send_response(status)
            if isinstance(body, list):
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in [*body, b""]:  # an empty chunk ends the body
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                return
            if isinstance(body, tuple):
                length, body = body
                self.close_connection = True
            else:
                length = len(body)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._reply()

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self._reply()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", script, seen
    httpd.shutdown()
    httpd.server_close()


def test_5xx_is_retried_until_an_answer(server):
    url, script, seen = server
    script += [(503, b"busy"), (500, b"oops"), (200, json.dumps({"ok": 1}).encode())]
    assert httpjson.request_json(url + "/x", {"a": 1}, retries=3) == {"ok": 1}
    assert seen == ["POST"] * 3
    script += [(200, b"vllm:spec_decode_num_drafts_total 3.0\n")]
    assert httpjson.request_text(url + "/metrics").startswith("vllm:")


def test_what_retries_do_not_cure_is_one_line(server):
    url, script, seen = server
    script += [(404, b"no such\nroute")]
    with pytest.raises(LabError, match=rf"^{url}/x: server answered HTTP 404: no such route$"):
        httpjson.request_json(url + "/x", retries=3)
    assert len(seen) == 1  # a 4xx is not retried
    script += [(502, b"down")] * 2
    with pytest.raises(LabError, match="HTTP 502: down"):
        httpjson.request_json(url + "/x", retries=1)
    script += [(200, b"<html>")]
    with pytest.raises(LabError, match=rf"^{url}/x: server answer is not JSON$"):
        httpjson.request_json(url + "/x")
    # a body cut short is a failed try: retried, then one line
    script += [(200, (100, b'{"ok": 1')), (200, json.dumps({"ok": 2}).encode())]
    assert httpjson.request_json(url + "/x", retries=1) == {"ok": 2}
    script += [(200, (100, b'{"ok": 1'))] * 2
    with pytest.raises(LabError, match=rf"^{url}/x: cannot reach the server \(IncompleteRead\(8 bytes read, 92 more"):
        httpjson.request_text(url + "/x", retries=1)
    closed = "http://127.0.0.1:9/x"  # the discard port: nothing listens
    with pytest.raises(LabError, match=rf"^{closed}: cannot reach the server .* after 3 tries$"):
        httpjson.request_json(closed, retries=2)


def _events(*lines: str) -> bytes:
    return "".join(f"{line}\n\n" for line in lines).encode()


def test_a_stream_yields_each_event_with_its_arrival_time(server):
    url, script, seen = server
    script += [(503, b"warming up"),
               (200, _events('data: {"n": 1}', ": a comment", "event: ping", 'data:{"n": 2}', "data: [DONE]",
                             'data: {"n": 3}'))]
    sent: list[float] = []
    events = list(httpjson.stream_json(url + "/generate", {"stream": True}, retries=1, sent=sent))
    assert [e for _, e in events] == [{"n": 1}, {"n": 2}]  # nothing after [DONE]
    assert events[0][0] <= events[1][0]
    assert seen == ["POST", "POST"]  # a 5xx before the stream began is retried
    assert len(sent) == 2 and sent[0] <= sent[1] <= events[0][0]  # each try's sending, the answered one last


def test_a_chunked_stream_splits_events_anywhere(server):
    url, script, _ = server
    body = _events('data: {"text": "a"}', 'data: {"text": "b"}', "data: [DONE]")
    script += [(200, [body[:3], body[3:17], body[17:18], body[18:]])]
    assert [e for _, e in httpjson.stream_json(url + "/v1/completions", {})] == [{"text": "a"}, {"text": "b"}]


def test_a_stream_that_fails_midway_is_one_line(server):
    url, script, seen = server
    script += [(200, _events('data: {"n": 1}', 'data: {"error": {"message": "out of memory"}}', "data: [DONE]"))]
    with pytest.raises(LabError, match=rf"^{url}/g: server reported an error mid-stream: .*out of memory"):
        list(httpjson.stream_json(url + "/g", {}))
    script += [(200, _events('data: {"object": "error", "message": "bad prompt"}'))]
    with pytest.raises(LabError, match="error mid-stream: bad prompt$"):
        list(httpjson.stream_json(url + "/g", {}))
    script += [(200, _events("data: <html>"))]
    with pytest.raises(LabError, match="server sent an event that is not JSON: <html>$"):
        list(httpjson.stream_json(url + "/g", {}))
    script += [(200, _events('data: {"n": 1}'))]  # the connection closed before [DONE]
    with pytest.raises(LabError, match=r"the stream ended before `data: \[DONE\]`$"):
        list(httpjson.stream_json(url + "/g", {}))
    script += [(200, json.dumps({"text": "whole"}).encode())]
    with pytest.raises(LabError, match=r"not a stream of server-sent events .*ignore \"stream\": true\?$"):
        list(httpjson.stream_json(url + "/g", {"stream": True}))
    assert len(seen) == 5  # a stream that began is never sent again


def test_an_answer_that_is_not_utf8_is_one_line(server):
    """A proxy's Latin-1 page, or an event with such bytes, was a UnicodeDecodeError traceback."""
    url, script, _ = server
    script += [(200, b"<html>caf\xe9</html>"), (200, b'data: {"t": "caf\xe9"}\n\ndata: [DONE]\n\n')]
    with pytest.raises(LabError, match=rf"^{url}/x: server answer is not JSON$"):
        httpjson.request_json(f"{url}/x", {})
    with pytest.raises(LabError, match=rf"^{url}/x: server sent an event that is not JSON: "):
        list(httpjson.stream_json(f"{url}/x", {}))
