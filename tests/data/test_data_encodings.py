"""Conversations encoded in worker processes (`--tokenize-workers`): the same ids, masks and notes, in
file order, as in one process; an error in a worker is the same one line naming file and conversation."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from data_helpers import PREPARE_ARGS, make_conversations, run_cli, write_jsonl
from test_data_harmony import HARMONY_TOOLS, SPECIAL, tool_loop

from drafter_lab.data import encodings as encodings_module
from drafter_lab.data.capture_config import CaptureConfig
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.encodings import encodings
from drafter_lab.targets.hf import load_tokenizer


@pytest.fixture
def gpt_oss(random_llama):
    """GPT-OSS's manner (test_data_harmony.py), its tokens and template set here, not in its files."""
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": [*SPECIAL, "<|call|>"]})
    tok.chat_template = HARMONY_TOOLS
    return tok


def test_workers_encode_as_this_process_does_in_order(gpt_oss, tmp_path, monkeypatch):
    """The tokenizer travels to the workers as it is here; chats, and tool loops with thinking and a
    parallel call the template leaves out, token-exact too."""
    write_jsonl(tmp_path / "chats.jsonl", make_conversations(6))
    convs, _ = read_conversations(tmp_path / "chats.jsonl")
    convs = [tool_loop(tmp_path, calls=2), *convs, tool_loop(tmp_path, result="2049")]
    ends = frozenset(gpt_oss.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>"))
    for exact in (False, True):
        if exact:
            convs = [dataclasses.replace(c, messages=[dict(m, token_ids=gpt_oss(m["content"], add_special_tokens=False)[
                "input_ids"]) if m["role"] == "assistant" and m["content"] else m for m in c.messages]) for c in convs]
        cfg = CaptureConfig(max_length=4096, token_exact=exact)
        here = list(encodings(convs, gpt_oss, cfg, ends, show=False))
        with monkeypatch.context() as m:  # the workers encode (this process could not)
            m.setattr(encodings_module, "encoded", None)
            there = list(encodings(convs, gpt_oss, dataclasses.replace(cfg, tokenize_workers=2), ends, show=False))
        assert [(e.ids.tolist(), e.mask.tolist(), e.thought, e.calls) for e in there] == \
            [(e.ids.tolist(), e.mask.tolist(), e.thought, e.calls) for e in here]
        assert there[0].calls == (1, 1) and there[0].thought == ((0, 0) if exact else (2, 1))
        assert there[0].ids.dtype == here[0].ids.dtype and there[0].mask.dtype == here[0].mask.dtype


@pytest.mark.parametrize("workers", [1, 2])
def test_data_prepare_with_workers_writes_the_same_shards(random_llama, conversations_file, features, tmp_path, capsys,
                                                          workers):
    out = tmp_path / "feat"
    assert run_cli("data", "prepare", "--target", random_llama, "--conversations", conversations_file, "--out", out,
                   *PREPARE_ARGS, "--tokenize-workers", str(workers)) == 0
    assert "tokenize conversations 20/20" in capsys.readouterr().err
    written = sorted(p.name for p in features.iterdir())
    assert sorted(p.name for p in out.iterdir()) == written and any(n.endswith(".safetensors") for n in written)
    for name in written:
        assert (out / name).read_bytes() == (features / name).read_bytes(), name


@pytest.mark.parametrize("workers", [1, 2])
def test_an_error_in_a_worker_is_one_line_naming_file_and_conversation(random_llama, tmp_path, capsys, workers):
    rows = [*make_conversations(3), {"id": "bad", "messages": [{"role": "assistant", "content": "first"}]}]
    convs = write_jsonl(tmp_path / "c.jsonl", rows)
    template = "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('begin with a user turn') }}{% endif %}"
    target = shutil.copytree(random_llama, tmp_path / "model")
    (target / "chat_template.jinja").write_text(template + (random_llama / "chat_template.jinja").read_text())
    # --strict: a conversation the template refuses is an error (else skipped and counted: test_review_s62_tooltemplate).
    assert run_cli("data", "prepare", "--target", target, "--conversations", convs, "--out", tmp_path / "o",
                   "--tokenize-workers", str(workers), "--strict") == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: {convs}: conversation bad: chat template rejects the conversation: begin with a user turn" in err


def test_tokenize_workers_must_be_at_least_one(random_llama, conversations_file, tmp_path, capsys):
    assert run_cli("data", "prepare", "--target", random_llama, "--conversations", conversations_file,
                   "--out", tmp_path / "o", "--tokenize-workers", "0") == 2
    assert "--tokenize-workers must be at least 1, got 0" in capsys.readouterr().err
