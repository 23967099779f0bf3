"""Tool calls from a table of both call forms, and reader checks mutation testing found untested
(review s76 h1)."""
import json

import pytest

from drafter_lab.data.conversations import read_conversations
from drafter_lab.errors import LabError

ASK = {"role": "user", "content": "time?"}


def _file(tmp_path, *rows):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_calls_of_both_forms_from_one_table_are_read_alike(tmp_path):
    """A table (pandas, `datasets`) holding bare calls and nested ones writes each call with the other
    form's keys null: a bare call's `"function": null` was read as its function, and refused."""
    bare = {"id": "c1", "type": None, "function": None, "name": "now", "arguments": '{"tz": "UTC"}'}
    nested = {"id": "c2", "type": "function", "function": {"name": "now", "arguments": "{}"},
              "name": None, "arguments": None}
    turns = [ASK, {"role": "assistant", "content": None, "tool_calls": [bare, nested]}]
    (conv,), _ = read_conversations(_file(tmp_path, {"messages": turns}))
    assert conv.messages[1]["tool_calls"] == [
        {"id": "c1", "type": "function", "function": {"name": "now", "arguments": {"tz": "UTC"}}},
        {"id": "c2", "type": "function", "function": {"name": "now", "arguments": {}}}]


def test_a_participant_name_on_a_user_or_assistant_turn_is_not_kept(tmp_path):
    """`name` (and `tool_call_id`) are a tool turn's: the OpenAI API's participant name on another turn is
    not the lab's to render, so it is left out, and one that is not text refuses nothing."""
    turns = [{"role": "user", "content": "time?", "name": "alice", "tool_call_id": 7},
             {"role": "assistant", "content": "noon", "name": "bot"}]
    (conv,), _ = read_conversations(_file(tmp_path, {"messages": turns}))
    assert conv.messages == [ASK, {"role": "assistant", "content": "noon"}]


def test_a_legacy_function_call_off_an_assistant_turn_is_refused_naming_that_field(tmp_path):
    """The refusal named tool_calls, a field the row does not have."""
    call = {"name": "now", "arguments": "{}"}
    for role in ("user", "tool"):
        path = _file(tmp_path, {"messages": [ASK, {"role": role, "content": "x", "function_call": call}]})
        with pytest.raises(LabError) as e:
            read_conversations(path)
        assert str(e.value) == f"{path}: line 1: function_call must be on an assistant turn"


def test_a_function_call_mirroring_one_of_the_tool_calls_is_read_once(tmp_path):
    """Some exports write the first tool call again in the legacy field: the same call, its arguments as text
    in one and an object in the other."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "now", "arguments": '{"tz": "UTC"}'}},
             {"id": "c2", "type": "function", "function": {"name": "date", "arguments": "{}"}}]
    turn = {"role": "assistant", "content": None, "tool_calls": calls,
            "function_call": {"name": "date", "arguments": {}}}
    (conv,), _ = read_conversations(_file(tmp_path, {"messages": [ASK, turn]}))
    assert [c["function"] for c in conv.messages[1]["tool_calls"]] == [
        {"name": "now", "arguments": {"tz": "UTC"}}, {"name": "date", "arguments": {}}]


@pytest.mark.parametrize("legacy", [{"name": "later", "arguments": "{}"}, {"name": "now", "arguments": '{"tz": "CET"}'}])
def test_a_function_call_beside_other_tool_calls_is_refused(tmp_path, legacy):
    """It was dropped without a word: a call the row makes that the tokens would not train on."""
    calls = [{"type": "function", "function": {"name": "now", "arguments": '{"tz": "UTC"}'}}]
    path = _file(tmp_path, {"messages": [ASK, {"role": "assistant", "content": None, "tool_calls": calls,
                                                "function_call": legacy}]})
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == (f"{path}: line 1: function_call {legacy['name']!r} is not one of the turn's "
                            "tool_calls: give a turn's calls in one of the two")
