"""An OpenAI-compatible chat server over a local HF model, for the regeneration tests: a real HTTP
server in its own process, answering /v1/chat/completions through the lab's own chat template
rendering and `generate`, one request at a time. As vLLM does, it answers only to the name it lists
at /v1/models (the model's path); as vLLM and SGLang do, a sampling knob the request leaves unset
comes from the model's generation_config.json, with `return_token_ids` the answer carries
`token_ids`, the end token it stopped at included, its `finish_reason` is "length" for an answer cut
at max_tokens and "stop" otherwise, and `chat_template_kwargs` and `tools` go to the
chat template, each call's arguments parsed from their JSON string first, as both servers do. Each
request is appended to LOG_FILE; the bound port is written to PORT_FILE once the server listens.
With REASONING_FIELD (SGLang's `reasoning_content`, vLLM's `reasoning`) it parses answers as a
DeepSeek-R1 reasoning parser does (the prompt opened the thinking): the text up to `</think>` is the
reasoning, the rest the answer, and an answer that never closed its thinking is all reasoning, its
content null.

    python chat_server.py MODEL_DIR PORT_FILE LOG_FILE [REASONING_FIELD]
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import torch

from drafter_lab.data.chat import render
from drafter_lab.data.regenerate import generate_texts, generation_config
from drafter_lab.targets.hf import load_target, stop_token_ids

torch.set_num_threads(1)
target = load_target(sys.argv[1])
port_file, log_file = Path(sys.argv[2]), Path(sys.argv[3])
NAME = sys.argv[1]  # the name it serves the model under, as vLLM serves a path
model_file = Path(sys.argv[1]) / "generation_config.json"
model_defaults = json.loads(model_file.read_text()) if model_file.exists() else {}
KNOBS = ("top_k", "top_p", "min_p", "repetition_penalty")  # those both servers read from the file
(END,) = stop_token_ids(target)  # the test models stop at one token: an answer short of max_tokens ended there
REASONING = sys.argv[4] if len(sys.argv) > 4 else None


def message(text: str) -> dict:
    if REASONING is None:
        return {"role": "assistant", "content": text}
    thought, closed, answer = text.removeprefix("<think>").partition("</think>")
    return {"role": "assistant", REASONING: thought, "content": answer if closed else None}


def parsed(m: dict) -> dict:
    """A turn as templates read it: a call's arguments an object, not the API's JSON string."""
    if "tool_calls" not in m:
        return m
    return {**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                                for c in m["tool_calls"]]}


def sampling(req: dict):
    gen = generation_config(target, req["temperature"], req["max_tokens"])
    for knob in KNOBS:
        value = req.get(knob, model_defaults.get(knob))
        if value is not None:
            setattr(gen, knob, 0 if knob == "top_k" and value == -1 else value)  # -1: every token
    return gen


class Handler(BaseHTTPRequestHandler):
    def _json(self, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != "/v1/models":
            self.send_error(404)
            return
        self._json({"object": "list", "data": [{"id": NAME, "object": "model"}]})

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(log_file, "a") as f:
            f.write(json.dumps(req) + "\n")
        if req.get("model") != NAME:  # as vLLM answers a name it does not serve
            self.send_error(404, f"the model {req.get('model')!r} does not exist")
            return
        prompt = render(target.tokenizer, [parsed(m) for m in req["messages"]], True, req.get("chat_template_kwargs"),
                        req.get("tools"))
        if req.get("frequency_penalty", 0) or req.get("presence_penalty", 0):
            self.send_error(400, "frequency and presence penalties are not served here")
            return
        text, ids = generate_texts(target, [prompt], sampling(req))[0]
        cut = len(ids) >= req["max_tokens"]  # no end token within max_tokens: `generate` ran the answer to it
        choice = {"index": 0, "message": message(text), "finish_reason": "length" if cut else "stop"}
        if req.get("return_token_ids"):
            choice["token_ids"] = ids if cut else ids + [END]
        self._json({"object": "chat.completion", "choices": [choice]})

    def log_message(self, *args):
        pass


HTTPServer.request_queue_size = 64  # the client keeps several conversations in flight
server = HTTPServer(("127.0.0.1", 0), Handler)
tmp = port_file.with_suffix(".tmp")
tmp.write_text(str(server.server_address[1]))
tmp.rename(port_file)
server.serve_forever()
