"""A server that answers SGLang's native API over the lab's own engine, for the served-eval tests:
a real HTTP server in its own process. `POST /generate` ({"input_ids", "sampling_params"}) decodes
with `SpecEngine` (greedy or sampled) and answers `output_ids` plus SGLang's `meta_info`:
completion_tokens and, with a drafter, spec_verify_ct and spec_accept_histogram (verify steps that
accepted 0, 1, 2, ... drafts). `GET /get_server_info` reports the speculative settings. Without a
drafter ("-") it is the baseline server. The bound port is written to PORT_FILE once it listens.

    python sglang_server.py MODEL_DIR DRAFTER_DIR|- STEPS PORT_FILE
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import torch

from drafter_lab.spec.engine import SpecConfig, SpecEngine
from drafter_lab.spec.pairing import load_for_target
from drafter_lab.targets.hf import load_target

torch.set_num_threads(1)
target = load_target(sys.argv[1])
drafter = None if sys.argv[2] == "-" else load_for_target(sys.argv[2], target)
steps, port_file = int(sys.argv[3]), Path(sys.argv[4])
info = {} if drafter is None else {"speculative_algorithm": "EAGLE3", "speculative_num_steps": steps,
                                   "speculative_eagle_topk": 1, "speculative_num_draft_tokens": steps + 1}


def generate(req: dict) -> dict:
    params = req["sampling_params"]
    cfg = SpecConfig(steps=steps, topk=1, temperature=params["temperature"], max_new_tokens=params["max_new_tokens"])
    g = SpecEngine(target, drafter, cfg).generate([req["input_ids"]], speculative=drafter is not None,
                                                  generator=torch.Generator().manual_seed(0))
    meta = {"completion_tokens": len(g.tokens[0])}
    if drafter is not None:
        meta["spec_verify_ct"] = len(g.accept_lengths)
        meta["spec_accept_histogram"] = [g.accept_lengths.count(n + 1) for n in range(max(g.accept_lengths, default=0))]
    return {"output_ids": g.tokens[0], "meta_info": meta}


class Handler(BaseHTTPRequestHandler):
    def _answer(self, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != "/get_server_info":
            self.send_error(404)
            return
        self._answer(info)

    def do_POST(self):
        if self.path != "/generate":
            self.send_error(404)
            return
        self._answer(generate(json.loads(self.rfile.read(int(self.headers["Content-Length"])))))

    def log_message(self, *args):
        pass


HTTPServer.request_queue_size = 64
server = HTTPServer(("127.0.0.1", 0), Handler)
tmp = port_file.with_suffix(".tmp")
tmp.write_text(str(server.server_address[1]))
tmp.rename(port_file)
server.serve_forever()
