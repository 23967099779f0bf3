"""Input shapes of conversations.py that no other test pinned (a second mutation audit): each test
here failed under a mutant of the reader that the rest of the suite let pass."""

from __future__ import annotations

import json

import pytest

from drafter_lab.data.conversations import Conversation, content_id, read_conversations, write_conversations
from drafter_lab.errors import LabError

ASK = {"role": "user", "content": "What time is it?"}
CALL = {"type": "function", "function": {"name": "now", "arguments": {"tz": "UTC"}}}


def one(tmp_path, row: dict) -> Conversation:
    """The one conversation of a file holding `row`."""
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (conv,), skipped = read_conversations(path)
    assert skipped == {}
    return conv


def refusal(tmp_path, line: str) -> str:
    """The error reading a file whose second line is `line` (written as given: Python's json reads NaN)."""
    path = tmp_path / "bad.jsonl"
    ok = {"conversations": [ASK, {"role": "assistant", "content": "noon"}]}
    path.write_text(json.dumps(ok) + "\n" + line + "\n")
    with pytest.raises(LabError) as e:
        read_conversations(path)
    return str(e.value)


@pytest.mark.parametrize("name", ["gpt", "chatgpt", "bing", "bard"])
def test_sharegpt_dump_names_of_the_answering_turn_are_the_assistant(tmp_path, name):
    """ShareGPT's own dump names the answering turn after the product (as SpecForge's prepare_data.py
    maps them): read as a user turn, those conversations had nothing to train on."""
    conv = one(tmp_path, {"conversations": [{"from": "human", "value": "hi"}, {"from": name, "value": "hello"}]})
    assert [m["role"] for m in conv.messages] == ["user", "assistant"]


def test_tools_and_functions_together_are_refused_naming_the_line(tmp_path):
    """A row with both `tools` and the older `functions` offers two lists the template would see one
    of: refused, not one of them dropped unseen."""
    row = {"tools": [{"type": "function", "function": {"name": "now"}}], "functions": [{"name": "now"}],
           "conversations": [ASK, {"role": "assistant", "content": "noon"}]}
    msg = refusal(tmp_path, json.dumps(row))
    assert msg.startswith(str(tmp_path / "bad.jsonl")) and "line 2: both tools and functions" in msg


@pytest.mark.parametrize("where", ["arguments", "tools"])
def test_nan_inside_an_object_is_refused_naming_the_line(tmp_path, where):
    """A NaN nested in an object (a call's arguments, a tool's schema) is no JSON number: written out
    again (regenerated, journalled) the file would not read back elsewhere."""
    call = {**CALL, "function": {"name": "now", "arguments": {"tz": {"offset": "__NAN__"}}}}
    tool = {"type": "function", "function": {"name": "now", "parameters": {"default": "__NAN__"}}}
    turns = [ASK, {"role": "assistant", "content": "", "tool_calls": [call if where == "arguments" else CALL]}]
    row = {"tools": [tool] if where == "tools" else [], "conversations": turns}
    msg = refusal(tmp_path, json.dumps(row).replace('"__NAN__"', "NaN"))
    assert msg.startswith(str(tmp_path / "bad.jsonl")) and "line 2: " in msg and "NaN" in msg


def test_a_nan_id_is_refused_not_named_nan(tmp_path):
    """`{"id": NaN}` (pandas writes a missing id so) is refused: read as text it named the conversation
    "nan", and every other such row a duplicate of it, skipped."""
    msg = refusal(tmp_path, '{"id": NaN, "conversations": [{"role": "user", "content": "a"}, '
                            '{"role": "assistant", "content": "b"}]}')
    assert msg.startswith(str(tmp_path / "bad.jsonl")) and "line 2: id has NaN" in msg


def test_token_id_zero_is_a_token(tmp_path):
    """Id 0 is a vocabulary's first token (GPT-2's "!"): an answer sampling it is kept, not refused."""
    answer = {"role": "assistant", "content": "!!", "token_ids": [0, 0], "temperature": 1.0}
    conv = one(tmp_path, {"conversations": [ASK, answer]})
    assert conv.messages[1]["token_ids"] == [0, 0]


def test_finish_reason_is_read_on_answers_alone(tmp_path):
    """A table of both dialects carries `finish_reason` on every turn: on a user or tool turn (which no
    server ends) it is neither kept nor checked."""
    turns = [{**ASK, "finish_reason": 0}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
             {"role": "tool", "content": "12:00", "finish_reason": "stop"},
             {"role": "assistant", "content": "noon", "finish_reason": "stop"}]
    conv = one(tmp_path, {"conversations": turns})
    assert ["finish_reason" in m for m in conv.messages] == [False, False, False, True]


def test_conversations_without_tools_are_written_without_a_tools_key(tmp_path):
    """SpecForge-style output names `tools` only where a conversation offers some: a `"tools": null`
    on every line is another file (and another hash) for the data it always wrote."""
    convs = [Conversation("a", [ASK, {"role": "assistant", "content": "noon"}]),
             Conversation("b", [ASK, {"role": "assistant", "content": "", "tool_calls": [CALL]}], tools=[])]
    path = tmp_path / "out.jsonl"
    write_conversations(path, convs)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert list(rows[0]) == ["id", "conversations"] and rows[1]["tools"] == []
    back, _ = read_conversations(path)
    assert [c.tools for c in back] == [None, []]


@pytest.mark.parametrize("key", ["tools", "functions"])
def test_tools_that_are_not_objects_are_refused_naming_the_line(tmp_path, key):
    """A list of names (not schemas) is no `tools`: refused here, not handed to the template to fail
    on (or to write unseen) later."""
    row = {key: ["now"], "conversations": [ASK, {"role": "assistant", "content": "noon"}]}
    msg = refusal(tmp_path, json.dumps(row))
    assert msg.startswith(str(tmp_path / "bad.jsonl")) and f"line 2: {key} must be a list of objects" in msg


def test_blank_lines_of_a_windows_file_are_skipped(tmp_path):
    """A jsonl written with CRLF line ends and a blank line between rows (or at the end) holds lines of
    "\\r" alone: blank, not invalid JSON."""
    row = json.dumps({"conversations": [ASK, {"role": "assistant", "content": "noon"}]})
    path = tmp_path / "win.jsonl"
    path.write_bytes(f"{row}\r\n\r\n  \t\r\n{row.replace('noon', '12')}\r\n\r\n".encode())
    convs, _ = read_conversations(path)
    assert [c.messages[1]["content"] for c in convs] == ["noon", "12"]


def test_the_id_of_a_conversation_in_other_scripts_stays_put():
    """A conversation without an id is named by a hash of its turns as UTF-8 text (not \\u escapes):
    the id, and so its train/val side and the work keyed on it, stays as earlier runs made it."""
    turns = [{"role": "user", "content": "Café?"}, {"role": "assistant", "content": "Ja, 咖啡."}]
    assert content_id(turns) == "sha256:abd87aeb794c4019"


def test_a_call_without_arguments_calls_with_none(tmp_path):
    """A call of a function without parameters, recorded without `arguments`, has none (an empty
    object): not refused as a call lacking them."""
    call = {"type": "function", "function": {"name": "now"}}
    conv = one(tmp_path, {"conversations": [ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]})
    assert conv.messages[1]["tool_calls"] == [{"type": "function", "function": {"name": "now", "arguments": {}}}]


def test_a_tool_turns_null_call_id_and_name_are_absent(tmp_path):
    """A table of both dialects holds null `tool_call_id` and `name` where a result had none: the turn
    has none (a template would write a null one as "None")."""
    turns = [ASK, {"role": "assistant", "content": "", "tool_calls": [CALL]},
             {"role": "tool", "content": "12:00", "tool_call_id": None, "name": None}, {"role": "assistant", "content": "noon"}]
    assert one(tmp_path, {"conversations": turns}).messages[2] == {"role": "tool", "content": "12:00"}


def test_a_directory_is_refused_naming_it(tmp_path):
    """A directory given as the conversations file (a run's output folder, say) is one line naming it,
    not a traceback."""
    with pytest.raises(LabError, match="conversations path is a directory") as e:
        read_conversations(tmp_path)
    assert str(e.value).startswith(str(tmp_path))
