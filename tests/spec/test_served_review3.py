"""`eval --server` review 3, against fake SGLang and vLLM servers in this process: a restarted vLLM
server's counters, a /metrics without speculative counters, the same URL as both servers, and a prompt
the server refuses."""

from __future__ import annotations

import json
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from drafter_lab import httpjson
from drafter_lab.cli import main

NEW = 8  # tokens each fake answer carries


class Fake:
    """A fake server: `engine` sglang or vllm; `spec` whether it speculates (each verify step emits 2
    tokens); `metrics` a function of the drafts counted so far returning /metrics text (vLLM);
    `refuse` a function of the request body returning (status, body) or None."""

    def __init__(self, engine: str, spec: bool = True, metrics=None, refuse=None):
        self.engine, self.spec, self.refuse = engine, spec, refuse
        self.drafts = 0
        self.metrics = metrics or (lambda drafts: self.standard_metrics(drafts) if spec else "")
        self.posts: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: bytes, kind="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/get_server_info" and fake.engine == "sglang":
                    info = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 1, "speculative_eagle_topk": 1,
                            "speculative_num_draft_tokens": 2} if fake.spec else {"speculative_algorithm": None}
                    self._send(200, json.dumps(info).encode())
                elif self.path == "/v1/models" and fake.engine == "vllm":
                    self._send(200, json.dumps({"data": [{"id": "m"}]}).encode())
                elif self.path == "/metrics" and fake.engine == "vllm":
                    self._send(200, fake.metrics(fake.drafts).encode(), "text/plain")
                else:
                    self.send_error(404)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.posts.append(req)
                if fake.refuse and (refused := fake.refuse(req)):
                    self._send(*refused)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for event in fake.events(req):
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @staticmethod
    def standard_metrics(drafts: int) -> str:
        labels = 'engine="0",model_name="m"'
        return (f"vllm:spec_decode_num_drafts_total{{{labels}}} {float(drafts)}\n"
                f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(drafts)}\n"
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="0"}} {float(drafts)}\n')

    def events(self, req: dict):
        if self.engine == "sglang":
            n = req["sampling_params"]["max_new_tokens"]
            ids = list(range(1, n + 1))
            steps = [1, *range(3, n + 1, 2)] + ([n] if n % 2 == 0 and n > 1 else []) if self.spec else list(range(1, n + 1))
            for k in steps:
                yield {"output_ids": ids[:k], "meta_info": {"completion_tokens": k}}
            meta = {"completion_tokens": n, "finish_reason": {"type": "length", "length": n}}
            if self.spec:
                meta["spec_verify_ct"] = (n - 1 + 1) // 2
            yield {"output_ids": ids, "meta_info": meta}
        else:
            n = req["max_tokens"]
            for k in range(n):
                yield {"choices": [{"index": 0, "text": f"t{k} ", "finish_reason": "length" if k == n - 1 else None}]}
            if self.spec:
                self.drafts += (n - 1 + 1) // 2
            yield {"choices": [], "usage": {"completion_tokens": n}}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fakes():
    made: list[Fake] = []

    def make(*args, **kwargs) -> Fake:
        made.append(Fake(*args, **kwargs))
        return made[-1]

    yield make
    for f in made:
        f.close()


def _eval(random_llama, prompts_file, url, engine, *extra) -> list[str]:
    return ["eval", "--server", url, "--engine", engine, "--target", str(random_llama), "--prompts", str(prompts_file),
            "--max-new-tokens", str(NEW), *extra]


def _error(argv, capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_vllm_server_restarted_mid_run_is_not_a_number(random_llama, prompts_file, fakes, capsys):
    """The counters read before the prompts were a server's that then restarted: they went back, and the
    eval said the server was launched without --speculative-config (or, had the restarted server
    counted past them, reported the difference as the accept length)."""
    reads = []

    def metrics(drafts):
        reads.append(drafts)
        return Fake.standard_metrics(drafts + (5000 if len(reads) == 1 else 0))  # the first read: before the restart

    restarted = fakes("vllm", metrics=metrics)
    err = _error(_eval(random_llama, prompts_file, restarted.url, "vllm"), capsys)
    assert err == (f"error: {restarted.url}/metrics: the speculative counters went back during the eval (the server "
                   "restarted?), so the accept length cannot be told: run the eval again")


def test_vllm_metrics_without_speculative_counters_say_so_before_the_prompts(random_llama, prompts_file, fakes,
                                                                             capsys):
    """A server launched with --disable-log-stats has a /metrics without the spec_decode counters: every
    prompt was decoded first, then the eval told a user who had passed --speculative-config to pass it."""
    bare = fakes("vllm", metrics=lambda drafts: 'python_gc_objects_collected_total{generation="0"} 1.0\n')
    err = _error(_eval(random_llama, prompts_file, bare.url, "vllm"), capsys)
    assert err.endswith("in /metrics): launch it with --speculative-config, and without --disable-log-stats")
    assert len(bare.posts) == 1  # the warm-up only


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_baseline_server_that_speculates_is_refused(engine, random_llama, prompts_file, fakes, capsys):
    """The same server passed as --server and --baseline-server (or another speculative one) gave a
    `ratio 1.0x` and `identical` outputs, as if speculation bought nothing."""
    spec, other = fakes(engine), fakes(engine)
    err = _error(_eval(random_llama, prompts_file, spec.url, engine, "--baseline-server",
                       spec.url.replace("127.0.0.1", "localhost") + "/"), capsys)
    assert err.endswith("is the --server itself: pass the same target served without speculation")
    err = _error(_eval(random_llama, prompts_file, spec.url, engine, "--baseline-server", other.url), capsys)
    assert err == (f"error: {other.url}: --baseline-server speculates (it reports speculative settings or counters): "
                   "pass the same target served without speculation")
    assert spec.posts == other.posts == []
    base = fakes(engine, spec=False)
    assert main(_eval(random_llama, prompts_file, spec.url, engine, "--baseline-server", base.url)) == 0


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_prompt_past_the_context_length_is_named(engine, random_llama, prompts_file, fakes, capsys, monkeypatch):
    """A 400 for one long prompt named neither the prompt nor what to do, and the server's message was cut
    off before its advice; a 429 (load) is not blamed on a prompt."""
    message = ("This model's maximum context length is 64 tokens. However, you requested 90 tokens (82 in the "
               "messages, 8 in the completion). Please reduce the length of the messages or completion.")

    def refuse(req):
        ids = req.get("input_ids", req.get("prompt"))
        return (400, json.dumps({"object": "error", "message": message}).encode()) if ids == long_ids else None

    probe = fakes(engine)
    assert main(_eval(random_llama, prompts_file, probe.url, engine)) == 0
    capsys.readouterr()
    key = "input_ids" if engine == "sglang" else "prompt"
    long_ids = probe.posts[3][key]  # the warm-up first: this is prompt 2 (c2)
    err = _error(_eval(random_llama, prompts_file, fakes(engine, refuse=refuse).url, engine), capsys)
    assert err.startswith(f"error: prompt 2 (c2), {len(long_ids)} tokens + --max-new-tokens {NEW}, was refused "
                          "(shorten or leave out that conversation, or lower --max-new-tokens if the context is full)")
    monkeypatch.setattr(httpjson, "time", types.SimpleNamespace(sleep=lambda s: None, time=time.time,
                                                                 perf_counter=time.perf_counter))  # 429s retried
    busy = fakes(engine, refuse=lambda req: (429, b'{"error": "Too Many Requests"}'))
    assert _error(_eval(random_llama, prompts_file, busy.url, engine), capsys).startswith(f"error: {busy.url}")
