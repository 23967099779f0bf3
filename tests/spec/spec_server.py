"""A server that answers SGLang's or vLLM's API over the lab's own engine, for the served-eval tests:
a real HTTP server in its own process, decoding each request with `SpecEngine` (one at a time).

- sglang: `POST /generate` ({"input_ids", "sampling_params", "stream": true}) streams `output_ids`
  so far and SGLang's `meta_info` (completion_tokens so far), then, once the decode is done, an
  event with the speculative counts (with a drafter: spec_verify_ct and spec_accept_histogram, the
  verify steps that accepted 0, 1, 2, ... drafts); `GET /get_server_info` the speculative settings.
- vllm: `POST /v1/completions` (token-id prompt, "stream": true) streams the new text (a split
  UTF-8 character held back until it is whole or the output ends), then the usage where
  stream_options.include_usage asks for it; `GET /v1/models` the model; `GET /metrics` Prometheus
  counters of drafts, accepted tokens and accepted tokens per position.

Answers are server-sent events sent as the engine emits the tokens (`generate(on_tokens=...)`):
the first token, from prefill, alone, then one event per verify step (per token without a drafter).

The engine samples plainly (softmax(logits / T) over the whole vocabulary); a request whose
sampling knobs, with those it leaves unset taken from the model's generation_config.json as vLLM
and SGLang take them, would reshape that is refused (HTTP 400).

Without a drafter ("-") it is the baseline server. The bound port is written to PORT_FILE once it
listens.

    python spec_server.py sglang|vllm MODEL_DIR DRAFTER_DIR|- STEPS PORT_FILE
"""

import json
import queue
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import torch

from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.pairing import load_for_target
from drafter_lab.targets.hf import load_target

torch.set_num_threads(1)
engine = sys.argv[1]
target = load_target(sys.argv[2])
drafter = None if sys.argv[3] == "-" else load_for_target(sys.argv[3], target)
steps, port_file = int(sys.argv[4]), Path(sys.argv[5])
counters = {"drafts": 0, "accepted": 0, "per_pos": [0] * steps}
model_file = Path(sys.argv[2]) / "generation_config.json"
model_defaults = json.loads(model_file.read_text()) if model_file.exists() else {}
NEUTRAL = {"top_k": (-1, 0), "top_p": (1,), "min_p": (0,), "repetition_penalty": (1,), "frequency_penalty": (0,),
           "presence_penalty": (0,)}


def reshaped(params: dict) -> list[str]:
    """The knobs that would not sample plainly, unset ones taken from the model's file."""
    return [f"{k}={v}" for k in NEUTRAL if (v := params.get(k, model_defaults.get(k))) is not None
            and v not in NEUTRAL[k]]


def decode(ids: list[int], temperature: float, max_new_tokens: int):
    """(tokens so far, the new ones, whether they end the output) as the engine emits them, on a
    thread of its own; then (the Generation, None, True)."""
    cfg = SpecConfig(steps=steps, topk=1, temperature=temperature, max_new_tokens=max_new_tokens)
    spec = SpecEngine(target, drafter, cfg)
    pieces: queue.Queue = queue.Queue()

    def run():
        try:
            pieces.put(spec.generate([ids], speculative=drafter is not None, generator=torch.Generator().manual_seed(0),
                                     on_tokens=lambda i, new: pieces.put(new)))
        except BaseException as e:  # the handler re-raises it
            pieces.put(e)

    threading.Thread(target=run, daemon=True).start()
    so_far: list[int] = []
    while isinstance(piece := pieces.get(), list):  # on_tokens's pieces, then the Generation (or an error)
        so_far = so_far + piece
        yield so_far, piece, len(so_far) >= max_new_tokens or so_far[-1] in spec.eos
    if isinstance(piece, BaseException):
        raise piece
    yield piece, None, True


def sglang_generate(req: dict):
    params = req["sampling_params"]
    for so_far, new, _ in decode(req["input_ids"], params["temperature"], params["max_new_tokens"]):
        if new is not None:
            yield {"output_ids": so_far, "meta_info": {"completion_tokens": len(so_far)}}
            continue
        g = so_far
        meta = {"completion_tokens": len(g.tokens[0])}
        if drafter is not None and g.accept_lengths:  # as recent SGLang: only for a request that verified
            meta["spec_verify_ct"] = len(g.accept_lengths)
            meta["spec_accept_histogram"] = [g.accept_lengths.count(n + 1)
                                             for n in range(max(g.accept_lengths, default=0))]
        yield {"output_ids": g.tokens[0], "meta_info": meta}


def vllm_completions(req: dict):
    sent = ""
    for so_far, new, last in decode(req["prompt"], req["temperature"], req["max_tokens"]):
        if new is not None:
            now = target.tokenizer.decode(so_far, skip_special_tokens=True)
            delta = "" if now.endswith("\ufffd") and not last else now[len(sent):]  # hold back a split character
            sent += delta
            yield {"object": "text_completion", "choices": [{"index": 0, "text": delta}], "usage": None}
            continue
        g = so_far
        for n in g.accept_lengths:  # n - 1 drafts accepted, a prefix of the chain
            counters["drafts"] += 1
            counters["accepted"] += n - 1
            for j in range(n - 1):
                counters["per_pos"][j] += 1
        if req.get("stream_options", {}).get("include_usage"):
            yield {"object": "text_completion", "choices": [], "usage": {"completion_tokens": len(g.tokens[0])}}


def metrics() -> str:
    labels = 'engine="0",model_name="tiny"'
    lines = ["# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} 0.0"]
    if drafter is not None:
        lines += ["# TYPE vllm:spec_decode_num_drafts counter",
                  f"vllm:spec_decode_num_drafts_total{{{labels}}} {float(counters['drafts'])}",
                  f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(counters['accepted'])}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{j}"}} {float(c)}'
                  for j, c in enumerate(counters["per_pos"])]
    return "\n".join(lines) + "\n"


GET = {"sglang": {"/get_server_info": lambda: {} if drafter is None else {
           "speculative_algorithm": "EAGLE3", "speculative_num_steps": steps, "speculative_eagle_topk": 1,
           "speculative_num_draft_tokens": steps + 1}},
       "vllm": {"/v1/models": lambda: {"data": [{"id": "tiny"}]}, "/metrics": metrics}}[engine]
POST = {"sglang": {"/generate": sglang_generate}, "vllm": {"/v1/completions": vllm_completions}}[engine]


class Handler(BaseHTTPRequestHandler):
    def _answer(self, obj) -> None:
        body = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if isinstance(obj, str) else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path not in GET:
            self.send_error(404)
            return
        self._answer(GET[self.path]())

    def _stream(self, events) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # no length: the answer ends as the connection closes
        for event in events:  # each as the engine emits it
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def do_POST(self):
        if self.path not in POST:
            self.send_error(404)
            return
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if bad := reshaped(req.get("sampling_params", req)):
            self.send_error(400, f"this engine samples plainly; {', '.join(bad)} would reshape it")
            return
        self._stream(POST[self.path](req))

    def log_message(self, *args):
        pass


HTTPServer.request_queue_size = 64
server = HTTPServer(("127.0.0.1", 0), Handler)
tmp = port_file.with_suffix(".tmp")
tmp.write_text(str(server.server_address[1]))
tmp.rename(port_file)
server.serve_forever()
