"""Input formats of conversations.py that no other test pinned (found by a mutation audit): each test
here failed under a mutant of the reader that the rest of the suite let pass."""

from __future__ import annotations

import json

import pytest

from drafter_lab.data.conversations import read_conversations
from drafter_lab.errors import LabError


def one(tmp_path, row: dict):
    """The one conversation of a file holding `row`."""
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (conv,), skipped = read_conversations(path)
    assert skipped == {}
    return conv


def test_gemini_model_role_is_the_assistant(tmp_path):
    """Gemini's and Gemma's exports name the answering turn `model`: it trains as the assistant."""
    conv = one(tmp_path, {"messages": [{"role": "user", "content": "hi"}, {"role": "model", "content": "hello"}]})
    assert [m["role"] for m in conv.messages] == ["user", "assistant"]


def test_empty_content_is_given_not_missing(tmp_path):
    """"" under `content` is a turn's text (empty), not an absent key to take `value` for: read as
    missing it refused the file as lacking role/content."""
    conv = one(tmp_path, {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "hello"}]})
    assert conv.messages[0] == {"role": "system", "content": ""}


def test_blank_arguments_and_blank_tool_calls_are_none(tmp_path):
    """Whitespace alone is as empty as "": a call without arguments, a turn without calls (not a
    parse error, not a string refused as no list)."""
    calls = [{"type": "function", "function": {"name": "now", "arguments": " \n"}}]
    conv = one(tmp_path, {"messages": [
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "content": "noon"},
        {"role": "assistant", "content": "It is noon.", "tool_calls": "  "},
    ]})
    assert conv.messages[1]["tool_calls"] == [{"type": "function", "function": {"name": "now", "arguments": {}}}]
    assert "tool_calls" not in conv.messages[3]


def test_several_thinking_parts_join_with_newlines(tmp_path):
    """Mistral's thinking parts, more than one ahead of the text, are one thinking, a line each (as its
    text parts join)."""
    conv = one(tmp_path, {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Add them."}, {"type": "thinking", "thinking": "It is 4."},
        {"type": "text", "text": "4"}]}]})
    assert conv.messages[1] == {"role": "assistant", "content": "4", "reasoning_content": "Add them.\nIt is 4."}


def test_booleans_are_no_token_ids(tmp_path):
    """JSON's true is a Python int: read as id 1 it would train a token the target never sampled."""
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "ok", "token_ids": [5, True]}]}) + "\n")
    with pytest.raises(LabError, match="token_ids must be a list of token ids"):
        read_conversations(path)


def test_greedy_temperature_zero_is_kept(tmp_path):
    """Temperature 0 (greedy decoding) is a temperature the target sampled at, not a bad value."""
    conv = one(tmp_path, {"messages": [{"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "ok", "token_ids": [5, 6], "temperature": 0}]})
    assert conv.messages[1]["temperature"] == 0


def test_a_blank_id_names_nothing(tmp_path):
    """An id of whitespace alone, like an empty one, gives way to the content hash: taken as the id,
    two such conversations were one, the second skipped as a repeat."""
    path = tmp_path / "c.jsonl"
    rows = [{"id": "  ", "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "ok"}]}
            for q in ("a?", "b?")]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    convs, skipped = read_conversations(path)
    assert skipped == {} and len(convs) == 2
    assert all(c.id.startswith("sha256:") for c in convs)


def test_a_file_of_skipped_conversations_is_read_not_refused_as_empty(tmp_path):
    """Rows without an assistant turn are skipped and counted: "holds no conversations" is for a file
    with no rows, not one whose every row was skipped (the count says why nothing trains)."""
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert read_conversations(path) == ([], {"no_assistant_turn": 1})


def test_sharegpt_roles_read_in_any_case_the_call_turn_too(tmp_path):
    """Roles are read case-insensitively (`Human`, `GPT`), ShareGPT's `function_call` turn among them:
    matched in lower case alone, `Function_Call` was refused as an unknown role."""
    call = {"name": "now", "arguments": {}}
    conv = one(tmp_path, {"conversations": [
        {"from": "Human", "value": "time?"}, {"from": "Function_Call", "value": json.dumps(call)},
        {"from": "Observation", "value": "noon"}, {"from": "GPT", "value": "It is noon."}]})
    assert [m["role"] for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
    assert conv.messages[1]["tool_calls"] == [{"type": "function", "function": call}]
