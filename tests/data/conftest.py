"""Conversations from real text and features captured through the CLI, and a scripted local chat server, for
the data tests."""

from __future__ import annotations

import contextlib
import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import torch
from data_helpers import PREPARE_ARGS, make_conversations, run_cli, write_jsonl

from drafter_lab.data import regenerate as regenerate_module


@contextlib.contextmanager
def one_thread():
    """The models here are tiny: a second intra-op thread adds only sync cost (and stalls a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="session")
def conversations_file(tmp_path_factory) -> Path:
    rows = make_conversations(20)
    rows.insert(5, {"id": "no-answer", "conversations": [{"role": "user", "content": "hello?"}]})
    return write_jsonl(tmp_path_factory.mktemp("convs") / "chats.jsonl", rows)


@pytest.fixture(scope="session")
def features(random_llama, conversations_file, tmp_path_factory) -> Path:
    """Features of the random Llama target, captured through `drafter-lab data prepare`."""
    out = tmp_path_factory.mktemp("features") / "feat"
    with one_thread():
        rc = run_cli("data", "prepare", "--target", random_llama, "--conversations", conversations_file,
                     "--out", out, *PREPARE_ARGS)
    assert rc == 0
    return out


@pytest.fixture
def interrupt_at(monkeypatch):
    """`interrupt_at(n)`: the n-th `generate` call (from 1) raises KeyboardInterrupt, as a Ctrl-C or a
    kill would stop the run there; returns the list of calls made so far."""

    def arm(n: int | None) -> list:
        calls, real = [], regenerate_module.generate_texts

        def generate_texts(*args, **kwargs):
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(regenerate_module, "generate_texts", generate_texts)
        return calls

    return arm


@pytest.fixture(scope="session")
def stopping_llama(random_llama, tmp_path_factory) -> Path:
    """The random Llama with its end token's lm_head row made that of a token its greedy answers
    use: the tie goes to the end token (lower id), so some answers stop short of 6 new tokens and the
    others are cut there (the random Llama alone never stops)."""
    import shutil

    from transformers import LlamaForCausalLM

    from drafter_lab.data.chat import render
    from drafter_lab.data.regenerate import generate_texts, generation_config
    from drafter_lab.targets.hf import load_target, stop_token_ids

    out = tmp_path_factory.mktemp("stopping") / "model"
    shutil.copytree(random_llama, out)
    target = load_target(random_llama)
    prompt = render(target.tokenizer, make_conversations(2)[1]["conversations"][:1], add_generation_prompt=True)
    (_, ids), = generate_texts(target, [prompt], generation_config(target, 0.0, 6))
    model = LlamaForCausalLM.from_pretrained(random_llama)
    (end,) = stop_token_ids(target)
    with torch.no_grad():
        model.lm_head.weight[end] = model.lm_head.weight[ids[2]]
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    """A 4-layer Llama of hidden size 8 and 100 tokens, for SpecForge samples of that size: the default aux
    ids repeat and run backwards there ([2, 2, 1])."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("tiny") / "target"
    LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=8, intermediate_size=16, num_hidden_layers=4,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(out)
    return out


@pytest.fixture
def scripted_chat(http_server):
    """(base URL, reply): a chat server whose answer to a request is reply[0](request) -> (status, body)."""
    reply = [None]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            status, body = reply[0](json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return http_server(Handler), reply
