"""Session 71, helper 4: conversations.parse_call and its neighbours."""

import json

import pytest

from drafter_lab.data.conversations import Conversation, parse_call, read_conversations
from drafter_lab.errors import LabError

WRAPPED = {"id": "c1", "type": "function", "function": {"name": "stat", "arguments": {"path": "a.py"}}}


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("bare", [
    {"id": "c1", "name": "stat", "arguments": {"path": "a.py"}},
    {"id": "c1", "type": "function", "name": "stat", "arguments": '{"path": "a.py"}'},
])
def test_a_bare_calls_id_sits_at_the_call_level_as_in_the_wrapped_form(bare):
    # Mistral's templates read tool_call.id; an id (or type) inside the function part is no function field
    assert parse_call(bare, "line 1", "f.jsonl") == WRAPPED


def test_a_bare_call_read_from_a_file_matches_its_wrapped_twin(tmp_path):
    turns = [{"role": "user", "content": "size?"}, None, {"role": "tool", "tool_call_id": "c1", "content": "9"},
             {"role": "assistant", "content": "9 bytes"}]
    bare = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "stat",
                                                                 "arguments": {"path": "a.py"}}]}
    wrapped = {**bare, "tool_calls": [WRAPPED]}
    rows = [{"conversations": [*turns[:1], turn, *turns[2:]]} for turn in (bare, wrapped)]
    convs, skipped = read_conversations(_jsonl(tmp_path / "c.jsonl", rows))
    assert convs[0].messages[1]["tool_calls"] == [WRAPPED]
    # the same conversation, so the same content id: the second is the first's duplicate
    assert (len(convs), skipped) == (1, {"duplicate_id": 1})


def test_a_record_reads_back_as_the_conversation_it_was():
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    for tools in (None, [{"type": "function", "function": {"name": "stat"}}]):
        conv = Conversation(id="a", messages=turns, tools=tools)
        assert ("tools" in conv.record()) is (tools is not None)
        assert Conversation.of(conv.record()) == conv


@pytest.mark.parametrize("call, says", [
    ({"name": "stat", "arguments": '{"size": NaN}'}, "a tool call's arguments hold NaN, which is not a JSON number"),
    ({"id": 7, "name": "stat", "arguments": {}}, "a tool call's id is int, not text"),
    ({"id": 7, "type": "function", "function": {"name": "stat", "arguments": {}}}, "a tool call's id is int, not text"),
])
def test_a_call_the_template_could_not_take_is_one_line_naming_the_file(tmp_path, call, says):
    rows = [{"conversations": [{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "", "tool_calls": [call]}]}]
    path = _jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == f"{path}: line 1: {says}"
