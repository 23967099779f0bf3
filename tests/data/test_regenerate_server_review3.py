"""Review of `data regenerate --server` against what real servers and gateways do: a 429 with
Retry-After, an always-streaming proxy, a prompt past the context length, and Ctrl-C while
conversations are in flight."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl

from drafter_lab import httpjson

CONTEXT = ("This model's maximum context length is 64 tokens. However, you requested 90 tokens (82 in the "
           "messages, 8 in the completion). Please reduce the length of the messages or completion.")


@pytest.fixture
def chat():
    """(base URL, posts, reply): a chat server listing model "served"; reply(n, request) gives the
    (status, body, headers) of the n-th POST (from 0), or None for a plain answer."""
    posts: list[dict] = []
    reply = [lambda n, req: None]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status, body, headers=()):
            body = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._send(200, {"object": "list", "data": [{"id": "served", "object": "model"}]})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                n = len(posts)
                posts.append(req)
            got = reply[0](n, req)
            if got is None:
                got = (200, {"choices": [{"index": 0, "finish_reason": "length", "message": {
                    "role": "assistant", "content": f"answer {len(req['messages'])}"}}]}, ())
            self._send(*got)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.handle_error = lambda *args: None  # a client gone (Ctrl-C) before its answer
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", posts, reply
    httpd.shutdown()
    httpd.server_close()


def _regenerate(tmp_path, url, *flags):
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    return run_cli("data", "regenerate", "--conversations", convs, "--out", tmp_path / "out.jsonl", "--server", url,
                   "--max-new-tokens", "8", *flags)


def test_a_rate_limit_is_waited_out_as_retry_after_asks(chat, tmp_path, monkeypatch):
    """A gateway before the engine (LiteLLM, a cloud endpoint) answers 429 with Retry-After under load:
    the run stopped at the first one, for a refusal that a wait cures."""
    url, posts, reply = chat
    slept = []
    monkeypatch.setattr(httpjson.time, "sleep", slept.append)
    reply[0] = lambda n, req: (429, {"error": "Too Many Requests"}, [("Retry-After", "7")]) if n in (0, 3) else None
    assert _regenerate(tmp_path, url, "--concurrency", "1") == 0
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and len(posts) == 4 * 2 + 2 and slept == [7.0, 7.0]
    assert httpjson._retry_after("100000") == httpjson.RETRY_AFTER_MAX_S and httpjson._retry_after("soon") == 0.0


def test_an_always_streaming_server_says_so(chat, tmp_path, capsys):
    url, _, reply = chat
    events = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n'
    reply[0] = lambda n, req: (200, events, [("Content-Type", "text/event-stream")])
    assert _regenerate(tmp_path, url, "--retries", "0") == 2
    assert 'server answered a stream of server-sent events, not JSON: it (or a proxy before it) ignores "stream": ' \
           "false" in capsys.readouterr().err


def test_a_prompt_past_the_context_length_says_what_to_do(chat, tmp_path, capsys):
    url, _, reply = chat
    reply[0] = lambda n, req: (400, {"object": "error", "message": CONTEXT, "code": 400}, ()) \
        if len(req["messages"]) > 3 else None
    assert _regenerate(tmp_path, url, "--retries", "0", "--concurrency", "1") == 2
    err = capsys.readouterr().err
    assert err.startswith("regenerate: conversation ")
    assert ", turn 5, was refused (shorten or leave out that conversation, or lower --max-new-tokens if the context " \
           f"is full): {url}/v1/chat/completions: server answered HTTP 400: " in err
    assert "maximum context length is 64 tokens" in err


def test_ctrl_c_does_not_wait_for_the_conversations_in_flight(chat, tmp_path):
    """Ctrl-C with conversations in flight: the exit waited for each to have all its turns back (minutes
    of generation on a real server), only to throw them away."""
    url, posts, reply = chat
    release = threading.Event()
    # a long generation: far longer than the exit may take on a loaded machine, so only a run that
    # waited for it fails
    reply[0] = lambda n, req: release.wait(300) and None
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(4))
    proc = subprocess.Popen([sys.executable, "-m", "drafter_lab", "data", "regenerate", "--conversations", str(convs),
                             "--out", str(tmp_path / "out.jsonl"), "--server", url, "--concurrency", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while len(posts) < 2:
            assert proc.poll() is None and time.time() < deadline, "the run ended before it could be interrupted"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(120)
    finally:
        release.set()
        proc.kill()
        proc.wait()
    assert rc == 130 and "interrupted" in proc.stderr.read() and len(posts) == 2
    assert not (tmp_path / "out.jsonl").exists()
