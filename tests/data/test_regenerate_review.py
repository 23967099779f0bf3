"""Review of conversation reading and regeneration on real-world input: ShareGPT's own speaker names,
BOM and CRLF files, templates that refuse a conversation, servers that refuse one, tokenizers that
return token_type_ids, left padding against each prompt alone, and a resume after SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from data_helpers import make_conversations, run_cli, write_jsonl

from drafter_lab.data import regenerate_server
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.regenerate import regenerate
from drafter_lab.data.regenerate_server import ServerConfig, regenerate_via_server
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target, stop_token_ids


def test_sharegpt_dump_speaker_names_are_assistant_turns(tmp_path):
    """ShareGPT's raw dump answers as `chatgpt`, `bing` or `bard` too (SpecForge's prepare_data.py maps
    them to assistant): such a file was refused as an unknown role."""
    row = {"id": "sg", "conversations": [{"from": "human", "value": "q1"}, {"from": "chatgpt", "value": "a1"},
                                         {"from": "human", "value": "q2"}, {"from": "bing", "value": "a2"},
                                         {"from": "human", "value": "q3"}, {"from": "bard", "value": "a3"}]}
    (conv,), skipped = read_conversations(write_jsonl(tmp_path / "c.jsonl", [row]))
    assert skipped == {} and [m["role"] for m in conv.messages] == ["user", "assistant"] * 3


def test_bom_crlf_and_blank_lines(tmp_path):
    rows = make_conversations(2)
    path = tmp_path / "c.jsonl"
    lines = [line.encode() for line in write_jsonl(tmp_path / "plain.jsonl", rows).read_text().splitlines()]
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n\r\n  \t\r\n".join(lines) + b"\r\n\r\n")
    convs, skipped = read_conversations(path)
    assert skipped == {} and [c.messages for c in convs] == \
        [c.messages for c in read_conversations(tmp_path / "plain.jsonl")[0]]


ALTERNATE = ("{% for m in messages %}{% if not loop.first and m['role'] == messages[loop.index0 - 1]['role'] %}"
             "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
             "{% endif %}{% endfor %}")
"""What Llama 2's and Mistral's templates check, ahead of the test target's own."""


def test_a_template_refusal_names_the_conversation(random_llama, tmp_path):
    """Two assistant turns in a row (as ShareGPT rows are once a turn of another speaker is dropped; two
    user turns in a row now get an answer between them), under a template that enforces alternation: the
    one-line error named no conversation, so nothing told which of thousands to mend."""
    target = load_target(random_llama)
    target.tokenizer.chat_template = ALTERNATE + target.tokenizer.chat_template
    rows = make_conversations(3)
    rows.append({"id": "twice", "conversations": [{"role": "user", "content": "q"},
                                                  {"role": "assistant", "content": "a"},
                                                  {"role": "assistant", "content": "and another"},
                                                  {"role": "user", "content": "q2"},
                                                  {"role": "assistant", "content": "a2"}]})
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", rows))
    with pytest.raises(LabError) as e:
        regenerate(target, convs, max_new_tokens=2, show_progress=False)
    assert str(e.value) == ("conversation twice, turn 5: chat template rejects the conversation: Conversation roles "
                            "must alternate user/assistant/user/assistant/...")


def test_a_server_refusal_names_the_conversation(tmp_path, monkeypatch):
    """A server refuses one conversation (longer than its context): the run stops there, every rerun
    too, and the error named no conversation."""
    rows = make_conversations(3)
    rows.append({"id": "too-long", "conversations": [{"role": "user", "content": "x " * 500},
                                                     {"role": "assistant", "content": "a"}]})
    source = write_jsonl(tmp_path / "c.jsonl", rows)
    convs, _ = read_conversations(source)
    url = "http://127.0.0.1:9/v1/chat/completions"

    def request_json(endpoint, body, **kw):
        if len(body["messages"][-1]["content"]) > 900:
            raise LabError("server answered HTTP 400: This model's maximum context length is 512 tokens", endpoint)
        return {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}

    monkeypatch.setattr(regenerate_server, "request_json", request_json)
    cfg = ServerConfig(url="http://127.0.0.1:9", model="m", concurrency=1, retries=0)
    with pytest.raises(LabError) as e:
        regenerate_via_server(convs, source, tmp_path / "out.jsonl", cfg, show_progress=False)
    assert str(e.value) == (f"{source}: conversation too-long, turn 2: {url}: server answered HTTP 400: This model's maximum "
                            "context length is 512 tokens")


def test_a_tokenizer_returning_token_type_ids(random_llama, tmp_path):
    """A tokenizer that lists token_type_ids among its inputs (transformers 4's default for a plain fast
    tokenizer) returns them: `generate` refused them for a causal LM, a ValueError traceback."""
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", make_conversations(3)))
    plain = regenerate(load_target(random_llama), convs, max_new_tokens=4, batch_size=2, show_progress=False)
    target = load_target(random_llama)
    target.tokenizer.model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    assert "token_type_ids" in target.tokenizer(["a"])
    typed = regenerate(target, convs, max_new_tokens=4, batch_size=2, show_progress=False)
    assert [c.messages for c in typed] == [c.messages for c in plain]


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_left_padding_answers_as_each_prompt_alone(random_llama, tmp_path, pad_is_eos):
    """Greedy in float32, prompts of very different lengths in one batch: each answer, those stopping
    at the end token and those cut at max_new_tokens alike, is its prompt's alone (batch size 1), with
    the pad token apart from the end token or the end token itself (a tokenizer without a pad token)."""
    target = load_target(random_llama)
    rows = make_conversations(8)
    for i, r in enumerate(rows):  # first turns from 1 to ~40 words
        key = "value" if "value" in r["conversations"][-4] else "content"
        r["conversations"][-4][key] = " ".join([r["conversations"][-4][key]] * (1 + 5 * (i % 4)))
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", rows))
    (end,) = stop_token_ids(target)
    alone = regenerate(target, convs, max_new_tokens=12, batch_size=1, show_progress=False)
    common = torch.tensor([t for c in alone for m in c.messages if m["role"] == "assistant"
                           for t in m["token_ids"]]).bincount().argsort(descending=True)[1]
    with torch.no_grad():  # the end token wins wherever that token would: answers of every length
        target.model.lm_head.weight[end] = target.model.lm_head.weight[common] * 1.05
    if pad_is_eos:
        target.tokenizer.pad_token = target.tokenizer.eos_token
    assert (target.tokenizer.pad_token_id == end) == pad_is_eos
    alone = regenerate(target, convs, max_new_tokens=12, batch_size=1, show_progress=False)
    batched = regenerate(target, convs, max_new_tokens=12, batch_size=8, show_progress=False)
    lengths = {len(m["token_ids"]) for c in alone for m in c.messages if m["role"] == "assistant"}
    assert 12 in lengths and len(lengths) > 2
    assert [c.messages for c in batched] == [c.messages for c in alone]


def test_a_sampled_run_killed_with_sigkill_resumes_to_the_same_bytes(random_llama, tmp_path):
    """SIGKILL, not Ctrl-C: nothing closes the journal; the resumed run writes the whole run's bytes."""
    convs = write_jsonl(tmp_path / "c.jsonl", make_conversations(10))
    args = ["data", "regenerate", "--conversations", convs, "--target", random_llama, "--batch-size", "2",
            "--temperature", "1.0", "--max-new-tokens", "24", "--seed", "7"]
    assert run_cli(*args, "--out", tmp_path / "whole.jsonl") == 0
    out, partial = tmp_path / "r.jsonl", tmp_path / "r.jsonl.partial"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "drafter_lab", *map(str, args), "--out", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (partial.exists() and partial.read_bytes().count(b"\n") >= 4):  # settings + 3 of 10 batches
            assert proc.poll() is None and time.time() < deadline, "the run ended before it could be killed"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert not out.exists() and partial.read_bytes().count(b"\n") < 11
    assert run_cli(*args, "--out", out) == 0
    assert out.read_bytes() == (tmp_path / "whole.jsonl").read_bytes() and not partial.exists()
