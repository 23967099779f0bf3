"""`--timeout` of `data regenerate --server` and `eval --server`: a server that stalls fails the command in
one line once the wait for a read runs out, not after the default 600 s; bad values are refused before
any request; and a server's long refusal is quoted up to 500 characters, cut with "..."."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drafter_lab import cli, httpjson
from drafter_lab.errors import LabError

CONVERSATIONS = [{"id": f"c{i}", "conversations": [{"role": "user", "content": f"def f{i}(x):"},
                                                   {"role": "assistant", "content": "return x"}]} for i in range(2)]
VLLM_REFUSAL = ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in "
                "the messages, 1000 in the completion). Please reduce the length of the messages or completion.")


@pytest.fixture
def stalling():
    """(base URL, requests it got as "METHOD path", refusal): GETs of /v1/models and /get_server_info are
    answered at once (an SGLang server with EAGLE3); a POST is read and then left unanswered until the
    test ends, as a server busy generating leaves it, unless `refusal["body"]` is set: then a 400 with it."""
    got: list[str] = []
    release = threading.Event()
    refusal: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            got.append(f"GET {self.path}")
            answers = {"/v1/models": {"data": [{"id": "tiny"}]},
                       "/get_server_info": {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3}}
            self._send(200, json.dumps(answers[self.path]).encode())

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            got.append(f"POST {self.path}")
            if "body" in refusal:
                self._send(400, refusal["body"])
            else:
                release.wait(60)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", got, refusal
    release.set()
    httpd.shutdown()
    httpd.server_close()


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _drafter_lab(*args) -> subprocess.CompletedProcess:
    """The CLI in a process of its own; its timeout only guards against the 600 s wait this is about."""
    return subprocess.run([sys.executable, "-m", "drafter_lab", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_regenerate_against_a_stalled_server_fails_at_the_timeout(stalling, tmp_path):
    url, got, _ = stalling
    convs = _jsonl(tmp_path / "c.jsonl", CONVERSATIONS[:1])
    done = _drafter_lab("data", "regenerate", "--conversations", convs, "--out", tmp_path / "out.jsonl",
                        "--server", url, "--timeout", "0.5", "--max-new-tokens", "4")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"error: {convs}: conversation c0, turn 2: {url}/v1/chat/completions: no answer within 0.5 s; not sent again, as "
        "the server may still be generating it")
    assert got == ["GET /v1/models", "POST /v1/chat/completions"]  # the generation was sent once
    assert not (tmp_path / "out.jsonl").exists()


def test_served_eval_against_a_stalled_server_fails_at_the_timeout(stalling, random_llama, tmp_path):
    url, got, _ = stalling
    prompts = _jsonl(tmp_path / "p.jsonl", CONVERSATIONS)
    done = _drafter_lab("eval", "--server", url, "--target", random_llama, "--prompts", prompts,
                        "--timeout", "0.5", "--max-new-tokens", "4")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"error: {url}/generate: no answer within 0.5 s; not sent again, as the server may still be generating it")
    assert got == ["GET /get_server_info", "POST /generate"]


REGENERATE = ["data", "regenerate", "--conversations", "c.jsonl", "--out", "o.jsonl", "--server"]
EVAL = ["eval", "--target", "no-target", "--prompts", "p.jsonl", "--server"]


@pytest.mark.parametrize("command", [REGENERATE, EVAL], ids=["regenerate", "eval"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e12", "soon"])
def test_a_bad_timeout_is_refused_before_any_request(stalling, capsys, command, value):
    url, got, _ = stalling
    with pytest.raises(SystemExit) as e:
        cli.main([*command, url, "--timeout", value])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        f"argument --timeout: expected a positive number of seconds (at most 1e9), got {value!r}")
    assert got == []


def test_a_timeout_without_a_server_is_refused(tmp_path, capsys):
    """It would be ignored: the run would not be the one asked for."""
    convs = _jsonl(tmp_path / "c.jsonl", CONVERSATIONS)
    missing = tmp_path / "no-target"  # refused before the target would load
    assert cli.main(["data", "regenerate", "--conversations", str(convs), "--out", str(tmp_path / "o.jsonl"),
                     "--target", str(missing), "--timeout", "5"]) == 2
    assert capsys.readouterr().err.strip() == "error: --timeout is for --server, not --target"
    assert cli.main(["eval", "--ngram", "--target", str(missing), "--prompts", str(convs), "--timeout", "5"]) == 2
    assert "--timeout, --retries and --request-rate apply to a served eval (--server)" in capsys.readouterr().err
    assert cli.main(["eval", "--ngram", "--target", str(missing), "--prompts", str(convs), "--retries", "1"]) == 2
    assert "--retries and --request-rate apply to a served eval (--server)" in capsys.readouterr().err


def test_served_eval_retries_as_asked(random_llama, tmp_path):
    """`eval --server --retries 0` tries a dead server once (it had no such flag: 4 tries, 15 s of back-off);
    a negative count, which would retry forever, is refused."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    prompts = _jsonl(tmp_path / "p.jsonl", CONVERSATIONS)
    done = _drafter_lab("eval", "--server", url, "--target", random_llama, "--prompts", prompts, "--retries", "0")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].endswith("after 1 tries")
    done = _drafter_lab("eval", "--server", url, "--target", random_llama, "--prompts", prompts, "--retries", "-1")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == "error: --retries must be >= 0, got -1"


def test_a_long_refusal_keeps_its_advice_and_a_longer_one_is_cut_visibly(stalling, monkeypatch):
    url, _, refusal = stalling
    refusal["body"] = json.dumps({"object": "error", "message": VLLM_REFUSAL, "type": "BadRequestError",
                                  "param": None, "code": 400}).encode()
    with pytest.raises(httpjson.HTTPStatusError) as e:
        httpjson.request_json(url + "/v1/completions", {"prompt": [1]})
    assert f"{VLLM_REFUSAL}\", \"type\": \"BadRequestError\", \"param\": null, \"code\": 400}}" in str(e.value)
    refusal["body"] = (" line\r\n" * 200).encode()
    with pytest.raises(LabError) as e:
        httpjson.request_json(url + "/v1/completions", {"prompt": [1]})
    assert str(e.value).endswith("server answered HTTP 400: " + " ".join(["line"] * 200)[:497] + "...")


def test_the_timeout_is_no_part_of_what_a_resume_matches(tmp_path):
    """A run killed at a stall resumes with a longer --timeout."""
    from drafter_lab.data.regenerate_server import ServerConfig, _settings

    convs = _jsonl(tmp_path / "c.jsonl", CONVERSATIONS)
    assert _settings(ServerConfig(url="http://x", timeout_s=0.5), convs) == _settings(ServerConfig(url="http://x"), convs)
