"""Conversations files as tables and datasets store them: both dialects written as one table (pandas' or
`datasets`' to_json, each row holding the other dialect's keys as null), tool results and calls stored as
JSON values or strings."""

from __future__ import annotations

import json

import pytest
from data_helpers import write_jsonl

from drafter_lab.data.conversations import read_conversations
from drafter_lab.errors import LabError


def test_the_other_dialects_null_keys_are_absent_keys(tmp_path):
    sharegpt = {"id": "a", "conversations": [{"from": "human", "value": "Hi", "role": None, "content": None},
                                             {"from": "gpt", "value": "Hello", "role": None, "content": None}],
                "messages": None}
    openai = {"id": "b", "conversations": None,
              "messages": [{"role": "user", "content": "Hi", "from": None, "value": None},
                           {"role": "assistant", "content": "Hey", "from": None, "value": None}]}
    convs, skipped = read_conversations(write_jsonl(tmp_path / "c.jsonl", [sharegpt, openai]), strict=True)
    assert [c.messages for c in convs] == [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hey"}]]
    assert skipped == {}


def test_a_result_stored_as_a_json_array_reads_as_its_json_text(tmp_path):
    """A tool's result kept as an array (search hits, rows) is a JSON value as an object is, not a
    list of content parts: it was refused as parts that are not text."""
    hits = [{"path": "a.py", "size": 10}, {"path": "ü.py", "size": 20}]
    rows = [{"id": str(k), "messages": [{"role": "user", "content": "Find files."}, {"role": "assistant", "content": "",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "find", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": result}, {"role": "assistant", "content": "Two."}]}
            for k, result in enumerate([hits, [1, 2], [{"type": "text", "text": "a.py"}, {"type": "text", "text": "b.py"}]])]
    convs, _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", rows))
    assert [c.messages[2]["content"] for c in convs] == [
        '[{"path": "a.py", "size": 10}, {"path": "ü.py", "size": 20}]', "[1, 2]", "a.py\nb.py"]


def test_tool_calls_stored_as_a_json_string_and_calls_without_arguments_are_read(tmp_path):
    """tool_calls as a JSON string was refused ("must be a list") though tools and arguments so stored
    were read, and a call's "arguments": "" (a call without arguments, as some clients record it)
    refused the whole file."""
    calls = [{"type": "function", "function": {"name": "now", "arguments": ""}}]
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"messages": [
        {"role": "user", "content": "time?"},
        {"role": "assistant", "content": None, "tool_calls": json.dumps(calls)},
        {"role": "tool", "content": "noon"},
        {"role": "assistant", "content": "It is noon.", "tool_calls": ""},
    ]}) + "\n")
    (conv,), _ = read_conversations(path)
    assert conv.messages[1]["tool_calls"] == [{"type": "function", "function": {"name": "now", "arguments": {}}}]
    assert "tool_calls" not in conv.messages[3]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "x"},
                                            {"role": "assistant", "content": "y", "tool_calls": "now()"}]}) + "\n")
    with pytest.raises(LabError, match="tool_calls must be a list"):
        read_conversations(bad)
