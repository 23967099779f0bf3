"""Review of session 68 (h4): a turn's thinking that is no text is named by the field that holds it; a
conversation that ends in a tool result keeps its calls trained and nothing after the result; a tool
result stored as an empty JSON array reads as the "[]" a chat template writes for it, not as ""; a line
that is no UTF-8 is named by its line (mutation audit of conversations.py)."""

from __future__ import annotations

import codecs
import json

import pytest
from data_helpers import run_cli, write_jsonl
from test_data_chat import spans
from test_data_harmony import STAT, harmony, harmony_tools, stops  # noqa: F401  (the fixtures)
from test_data_tools import TOOLS, ends, hermes, hermes_llama, row  # noqa: F401  (the fixtures)
from test_tool_arguments_review import DEEPSEEK_V3, EOS, templated

from drafter_lab.data.chat import encode_conversation, render
from drafter_lab.data.conversations import read_conversations
from drafter_lab.data.shards import FeatureSet
from drafter_lab.errors import LabError

RULE = "reasoning_content (or reasoning, thinking) must be text, on an assistant turn"


def turns(*messages) -> dict:
    return {"messages": [{"role": "user", "content": "How big is setup.py?"}, *messages]}


@pytest.mark.parametrize("turn, named", [
    ({"role": "assistant", "content": "2 KB.", "thinking": 7}, "thinking is int"),
    ({"role": "assistant", "content": None, "reasoning": ["Stat it."]}, "reasoning is list"),
    # "" under one name, the thinking under another (as servers send it): the other is read, so named
    ({"role": "assistant", "content": "2 KB.", "reasoning_content": "", "thinking": {"text": "x"}}, "thinking is dict"),
    # text under one name does not hide a field that is no text
    ({"role": "assistant", "content": "2 KB.", "reasoning_content": "Stat it.", "thinking": True}, "thinking is bool"),
    ({"role": "user", "content": "And?", "thinking": "Hm."}, "thinking on a user turn"),
    ({"role": "tool", "content": "2048", "reasoning": "Hm."}, "reasoning on a tool turn"),
    ({"role": "user", "content": [{"type": "thinking", "thinking": "Hm."}, {"type": "text", "text": "And?"}]},
     "thinking parts on a user turn"),
])
def test_thinking_that_is_no_text_is_named_by_its_field(tmp_path, turn, named):
    path = write_jsonl(tmp_path / "c.jsonl", [turns({"role": "assistant", "content": "1 KB."}),
                                              turns({"role": "assistant", "content": "1 KB."}, turn)])
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == f"{path}: line 2: {RULE}: {named}"


def test_thinking_given_twice_names_the_field(tmp_path):
    parts = [{"type": "thinking", "thinking": "Stat it."}, {"type": "text", "text": "2 KB."}]
    path = write_jsonl(tmp_path / "c.jsonl", [turns({"role": "assistant", "content": parts, "reasoning": "Stat."})])
    with pytest.raises(LabError, match=r"line 1: thinking both as content parts and as reasoning$"):
        read_conversations(path)


def trailing_result(tmp_path):
    """The tool-use conversation of test_data_tools cut after the tool's result (an agent's trajectory
    recorded up to its last tool call): no answer follows the result."""
    data = row()
    data["messages"] = data["messages"][:-1]
    (conv,), skipped = read_conversations(write_jsonl(tmp_path / "c.jsonl", [data]), strict=True)
    assert skipped == {} and [m["role"] for m in conv.messages] == ["system", "user", "assistant", "tool"]
    return conv


def masked(tok, conv, end_ids, **kw) -> list[str]:
    ids, mask = encode_conversation(tok, conv.messages, 10_000, end_ids=end_ids, tools=conv.tools, **kw)
    assert not mask[-1]  # the result closes the sequence, unmasked: the tool's text, not the target's
    return [tok.decode(ids[a:b]) for a, b in spans(mask)]


CALL_HERMES = '<tool_call>\n{"name": "stat", "arguments": {"path": "setup.py"}}\n</tool_call><|im_end|>'
CALL_DEEPSEEK = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>stat\n```json\n{"path": "setup.py"}\n```'
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>")


@pytest.mark.parametrize("last_only", [False, True])
def test_a_conversation_ending_in_a_tool_result_trains_its_call_alone(hermes, random_llama, tmp_path, last_only):  # noqa: F811
    """As SpecForge masks it (assistant turns alone): the call before the result trains, up to its end
    token, and nothing is looked for after the result. Token-exact, a call without ids stays text."""
    conv = trailing_result(tmp_path)
    assert masked(hermes, conv, ends(hermes), last_only=last_only) == [CALL_HERMES]
    assert masked(hermes, conv, ends(hermes), last_only=last_only, token_exact=True) == []
    deepseek = templated(random_llama, DEEPSEEK_V3)  # closes the results with their own end tag
    assert masked(deepseek, conv, frozenset({deepseek.convert_tokens_to_ids(EOS)}), last_only=last_only) == [CALL_DEEPSEEK]


def test_gpt_oss_trains_a_last_call_with_its_analysis(harmony_tools, tmp_path):  # noqa: F811
    """GPT-OSS's template writes a call's analysis until a final answer follows: with none after the
    result, the analysis stays and trains with the call, up to `<|call|>`."""
    call = {"type": "function", "function": {"name": "stat", "arguments": json.dumps({"path": "setup.py"})}}
    data = {"tools": [STAT], "messages": [
        {"role": "user", "content": "How big is setup.py?"},
        {"role": "assistant", "content": None, "reasoning_content": "Need stat.", "tool_calls": [call]},
        {"role": "tool", "content": "2048"}]}
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [data]))
    assert masked(harmony_tools, conv, stops(harmony_tools)) == [
        "<|channel|>analysis<|message|>Need stat.<|end|><|start|>assistant to=functions.stat<|channel|>commentary json"
        '<|message|>{"path": "setup.py"}<|call|>']


def test_prepare_keeps_a_conversation_ending_in_a_tool_result(hermes_llama, hermes, tmp_path):  # noqa: F811
    data = row("cut")
    data["messages"] = data["messages"][:-1]
    convs = write_jsonl(tmp_path / "c.jsonl", [data, row("whole")])
    assert run_cli("data", "prepare", "--target", hermes_llama, "--conversations", convs, "--out", tmp_path / "feat",
                   "--val-fraction", "0", "--strict") == 0
    seqs = {s.seq_id: s for s in FeatureSet(tmp_path / "feat").sequences("train")}
    assert sorted(seqs) == ["cut", "whole"]
    assert hermes.decode(seqs["cut"].input_ids[seqs["cut"].loss_mask]) == CALL_HERMES


def test_an_empty_array_result_reads_as_the_template_writes_it(hermes, tmp_path):  # noqa: F811
    """A result stored as a JSON value reads as its JSON text, an empty array too: a template handed
    the array writes "[]" (Llama 3.1's and GPT-OSS's `tojson`, Qwen2.5's and this one's text). Until
    2026-12-06 it read as "", the empty content parts of a user turn, which still read so."""
    empty = row("empty")
    empty["messages"][3] = {**empty["messages"][3], "content": []}
    parts = row("parts")
    parts["messages"][3] = {**parts["messages"][3], "content": [{"type": "text", "text": "2048"}]}
    user = {"messages": [{"role": "user", "content": []}, {"role": "assistant", "content": "?"}]}
    (conv, as_parts, asked), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [empty, parts, user]))
    assert conv.messages[3]["content"] == "[]"
    assert as_parts.messages[3]["content"] == "2048" and asked.messages[0]["content"] == ""
    raw = [*conv.messages[:3], {**conv.messages[3], "content": []}, *conv.messages[4:]]  # the array handed to it
    assert render(hermes, conv.messages, tools=TOOLS) == hermes.apply_chat_template(raw, tools=TOOLS, tokenize=False)
    assert "<tool_response>\n[]\n</tool_response>" in render(hermes, conv.messages, tools=TOOLS)


@pytest.mark.parametrize("bom", [b"", codecs.BOM_UTF8])
def test_a_line_not_in_utf8_is_named_by_its_line(tmp_path, bom):
    """UTF-8 (with a byte order mark or without) is read as it is, each line decoded as it is read: a
    byte that is no UTF-8 (a Latin-1 "é") names its line, not the whole file as no UTF-8."""
    good = json.dumps(turns({"role": "assistant", "content": "1 KB."})).encode()
    path = tmp_path / "c.jsonl"
    path.write_bytes(bom + good + b"\n" + json.dumps(turns()).encode().replace(b"setup.py", b"caf\xe9.py") + b"\n")
    with pytest.raises(LabError, match=r"c\.jsonl: line 2 is not valid JSON \('utf-8' codec can't decode byte 0xe9"):
        read_conversations(path)


@pytest.mark.parametrize("content", [["How big is setup.py?"], [{"text": "How big is setup.py?"}]])
def test_content_parts_without_their_type_are_refused(tmp_path, content):
    """A list of bare strings, or of parts with no "type", is no list of text parts (a crash on the
    string, a part without its type read as text, were it taken so)."""
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": content},
                                                            {"role": "assistant", "content": "2 KB."}]}])
    with pytest.raises(LabError, match=r'c\.jsonl: line 1: turn content parts must all be \{"type": "text"'):
        read_conversations(path)


def test_a_path_given_as_text_reads_alike(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [turns({"role": "assistant", "content": "1 KB."})])
    assert read_conversations(str(path)) == read_conversations(path)
