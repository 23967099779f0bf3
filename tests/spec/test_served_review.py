"""`eval --server` review: a short answer's error names the cause, and a server's error is one line."""

from __future__ import annotations

import http.client
import io
import json
import time
import urllib.error
from types import SimpleNamespace

import pytest

from drafter_lab import httpjson
from drafter_lab.errors import LabError
from drafter_lab.spec import served


def test_answers_that_end_at_their_first_token_ask_for_more_tokens(monkeypatch):
    """Recent SGLang leaves the speculative fields out of a request that never verified, and vLLM counts
    no drafts for it: `--max-new-tokens 1` was told the server had no speculative decoding."""
    with pytest.raises(LabError, match="^u: every answer ended at its first token .* raise --max-new-tokens$"):
        served.acceptance([{"completion_tokens": 1}, {"completion_tokens": 1}], "u")
    with pytest.raises(LabError, match="no speculative decoding"):  # a longer answer without them: not speculative
        served.acceptance([{"completion_tokens": 1}, {"completion_tokens": 9}], "u")

    server = served.VLLM("http://v", served.ServedConfig(url="http://v", engine="vllm"))
    zero = {"drafts": 0.0, "accepted": 0.0, "per_pos": {}}
    monkeypatch.setattr(server, "_counters", lambda: zero)
    server.start_counting()
    short = [served.Answer("a", 1, {}, 0.1, 0.1, 1), served.Answer("", 1, {}, 0.1, 0.1, 1)]
    with pytest.raises(LabError, match=r"^http://v/metrics: every answer ended at its first token"):
        server.acceptance(short)
    with pytest.raises(LabError, match="counted no speculative drafts"):
        server.acceptance([*short, served.Answer("abc", 3, {}, 0.1, 0.2, 2)])


def _http_error(url: str, code: int, body) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(url, code, "Bad Gateway", http.client.HTTPMessage(), body)


def test_a_server_error_is_one_line(monkeypatch):
    """nginx's error pages end their lines with CRLF: the CRs stayed in the message and, on a terminal,
    overwrote the URL and the status with the page's last line."""
    page = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway"
            b"</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")

    def urlopen(request, timeout):
        raise _http_error(request.full_url, 502, io.BytesIO(page))

    monkeypatch.setattr(httpjson.urllib.request, "urlopen", urlopen)
    with pytest.raises(LabError) as e:
        httpjson.request_json("http://s/get_server_info", retries=0)
    message = str(e.value)
    assert message.startswith("http://s/get_server_info: server answered HTTP 502: <html> <head><title>502 Bad")
    assert "\r" not in message and "\n" not in message

    # vLLM's older error event: a message that spans lines
    event = {"object": "error", "message": "CUDA error: an illegal memory access\nCompile with TORCH_USE_CUDA_DSA"}
    monkeypatch.setattr(httpjson.urllib.request, "urlopen", lambda request, timeout: io.BytesIO(
        f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()))
    with pytest.raises(LabError) as e:
        list(httpjson.stream_json("http://s/v1/completions", {}, retries=0))
    assert str(e.value) == ("http://s/v1/completions: server reported an error mid-stream: CUDA error: an illegal "
                            "memory access Compile with TORCH_USE_CUDA_DSA")


def test_an_error_answer_whose_body_breaks_off_is_a_lab_error(monkeypatch):
    """A 5xx whose body is cut short (a proxy or a server going down) raised IncompleteRead from inside
    the handler of the HTTPError: a traceback, where the status alone says enough."""
    class CutShort(io.BytesIO):
        def read(self, *args):
            raise http.client.IncompleteRead(b"<html>", 482)

    tries = []

    def urlopen(request, timeout):
        tries.append(request.full_url)
        raise _http_error(request.full_url, 502, CutShort())

    monkeypatch.setattr(httpjson.urllib.request, "urlopen", urlopen)
    monkeypatch.setattr(httpjson, "time", SimpleNamespace(perf_counter=time.perf_counter, sleep=lambda s: None))
    with pytest.raises(LabError, match=r"^http://s/generate: server answered HTTP 502: \(its body broke off\)$"):
        served.SGLang("http://s", served.ServedConfig(url="http://s", retries=1)).generate([1], 4)
    assert len(tries) == 2  # still a 5xx: retried as one whose body came whole

