"""A conversation the chat template refuses, or writes so that a turn cannot be placed, is that
conversation's fault under the template: `data prepare` skips it and counts it in its summary (an error
under --strict, as for a conversation without an assistant turn) rather than stopping the whole run.
DeepSeek-V3-0324's released template writes a second turn of tool calls without its assistant header
(its `ns.is_first` is never reset), so such a turn cannot be placed."""

from __future__ import annotations

import json

import pytest
from data_helpers import make_conversations, run_cli, write_jsonl
from test_data_tools import ANSWER, CALL, TOOLS
from test_tool_arguments_review import DEEPSEEK_V3, SPECIAL

from drafter_lab.data.capture import TEMPLATE_REFUSES, CaptureConfig, tokenize_conversations
from drafter_lab.data.chat import TemplateRefusal, encode_conversation
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.shards import FeatureSet
from drafter_lab.errors import LabError
from drafter_lab.targets.hf import load_target, load_tokenizer


def stat(cid: str, path: str) -> dict:
    return {**CALL, "id": cid, "function": {"name": "stat", "arguments": json.dumps({"path": path})}}


def agent(cid: str, calls: int) -> dict:
    """A tool-using conversation whose assistant makes `calls` turns of tool calls before its answer."""
    messages = [{"role": "user", "content": "How big are the files?"}]
    for k in range(calls):
        messages += [{"role": "assistant", "content": None, "tool_calls": [stat(f"c{k}", f"f{k}.py")]},
                     {"role": "tool", "tool_call_id": f"c{k}", "content": str(1024 * (k + 1))}]
    return {"id": cid, "tools": TOOLS, "messages": [*messages, {"role": "assistant", "content": ANSWER}]}


@pytest.fixture(scope="module")
def deepseek_llama(random_llama, tmp_path_factory):
    """The random Llama saved with DeepSeek-V3-0324's chat template and its special tokens."""
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("deepseek") / "model"
    tok = load_tokenizer(random_llama)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.chat_template = DEEPSEEK_V3
    model = LlamaForCausalLM.from_pretrained(random_llama)
    model.resize_token_embeddings(len(tok))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def rows() -> list[dict]:
    return [*make_conversations(4), agent("one-call", 1), agent("two-calls", 2)]


def test_the_template_cannot_place_a_second_turn_of_calls(deepseek_llama, tmp_path):
    tok = load_tokenizer(deepseek_llama)
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [agent("one", 1), agent("two", 2)]))
    encode_conversation(tok, convs[0].messages, 10_000, tools=convs[0].tools)
    with pytest.raises(TemplateRefusal, match="chat template drops or rewrites assistant turn 3"):
        encode_conversation(tok, convs[1].messages, 10_000, tools=convs[1].tools)


@pytest.mark.parametrize("workers", [1, 2])
def test_prepare_skips_and_counts_what_the_template_refuses(deepseek_llama, tmp_path, capsys, workers):
    convs = write_jsonl(tmp_path / "c.jsonl", rows())
    out = tmp_path / "feat"
    assert run_cli("data", "prepare", "--target", deepseek_llama, "--conversations", convs, "--out", out,
                   "--val-fraction", "0", "--tokenize-workers", workers) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "skipped 1 of 6 sequences the chat template refuses" in said
    assert "(first: conversation two-calls: chat template drops or rewrites assistant turn 3" in said
    features = FeatureSet(out)
    assert features.manifest.skipped == {TEMPLATE_REFUSES: 1}
    ids = {s.seq_id for s in features.sequences("train")}
    assert "one-call" in ids and "two-calls" not in ids and len(ids) == 5


def test_strict_makes_it_an_error(deepseek_llama, tmp_path, capsys):
    convs = write_jsonl(tmp_path / "c.jsonl", rows())
    assert run_cli("data", "prepare", "--target", deepseek_llama, "--conversations", convs, "--out",
                   tmp_path / "feat", "--val-fraction", "0", "--strict") == 2
    err = capsys.readouterr().err
    assert "conversation two-calls: chat template drops or rewrites assistant turn 3" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "feat").exists()


def test_a_template_that_raises_is_skipped_too_and_other_errors_still_stop(deepseek_llama, tmp_path):
    """A template's own raise_exception (Mistral's "roles must alternate") is the conversation's; a
    token-exact capture of text without the target's tokens is the run's, and stops it."""
    target = load_target(deepseek_llama)
    target.tokenizer.chat_template = ("{% if messages | length > 3 %}{{ raise_exception('too long') }}{% endif %}"
                                      + DEEPSEEK_V3)
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", rows()))
    skipped: dict = {}
    items = tokenize_conversations(target, convs, CaptureConfig(), "c.jsonl", skipped, main=False)
    assert [it[0] for it in items] == [c.id for c in convs if len(c.messages) <= 3]
    assert skipped == {TEMPLATE_REFUSES: sum(len(c.messages) > 3 for c in convs)}
    with pytest.raises(LabError, match="c.jsonl: conversation .*: chat template rejects the conversation: too long"):
        tokenize_conversations(target, convs, CaptureConfig(strict=True), "c.jsonl", {}, main=False)
    target.tokenizer.chat_template = DEEPSEEK_V3
    with pytest.raises(LabError, match="assistant turn 2 has no token_ids"):
        tokenize_conversations(target, convs[:1], CaptureConfig(token_exact=True), "c.jsonl", {}, main=False)
