"""Review of session 70 (h5), bad input of the conversations reader: a file that cannot be read is one line
naming it (a PermissionError, or a path through a file, died in a traceback); a content part that is no text
is named by its place, and a tool result's refusal says how to give a JSON array of typed objects; a role
that is no text is named by its kind, not its Python repr; a number id is named as Python writes it."""

from __future__ import annotations

import codecs
import json
import os

import pytest
from data_helpers import write_jsonl

from drafter_lab.data.conversations import conversations_sha256, read_conversations
from drafter_lab.errors import LabError

PAIR = [{"role": "user", "content": "How big is setup.py?"}, {"role": "assistant", "content": "2 KB."}]
CALL = {"role": "assistant", "content": None, "tool_calls": [{"name": "search", "arguments": {"q": "setup.py"}}]}


def refusal(path) -> str:
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert e.value.exit_code == 2
    return str(e.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_is_one_line_naming_it(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": PAIR}])
    path.chmod(0)
    try:
        said = f"{path}: conversations file is not readable (permission denied)"
        assert refusal(path) == said
        with pytest.raises(LabError) as e:  # the hash that keys a capture or a regeneration
            conversations_sha256(path)
        assert str(e.value) == said
    finally:
        path.chmod(0o644)


def test_a_path_through_a_file_is_one_line_naming_it(tmp_path):
    """Any other failed read (here a NotADirectoryError, which root meets too) says the system's reason."""
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": PAIR}]) / "more.jsonl"
    said = f"{path}: cannot read the conversations file (Not a directory)"
    assert refusal(path) == said
    with pytest.raises(LabError) as e:
        conversations_sha256(path)
    assert str(e.value) == said


@pytest.mark.parametrize("result, k", [([{"type": "hit", "url": "a"}, {"type": "hit", "url": "b"}], 1),
                                       ([{"type": "text", "text": "2 hits:"}, {"type": "image_url"}], 2),
                                       ([{"type": "text", "text": "2 hits:"}, {"type": "text", "text": 2}], 2)])
def test_a_tool_results_parts_that_are_no_text_are_refused_saying_how_to_give_them(tmp_path, result, k):
    """OpenAI's tool message takes text parts alone; a result that is a JSON array of objects carrying a
    "type" cannot be told from parts, so the refusal names the part and says to give the array as text."""
    turns = [PAIR[0], CALL, {"role": "tool", "content": result}, PAIR[1]]
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": PAIR}, {"messages": turns}])
    assert refusal(path) == (f'{path}: line 2: turn content parts must all be {{"type": "text", "text": ...}}, and '
                             f"part {k} is not (a drafter of text reads no images or audio; a result that is a JSON "
                             "array of typed objects goes as its JSON text)")
    turns[2]["content"] = json.dumps(result)  # as the refusal says: read as the tool's text
    (_, conv), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [{"messages": PAIR}, {"messages": turns}]))
    assert conv.messages[2] == {"role": "tool", "content": json.dumps(result)}


def test_a_user_turns_part_that_is_no_text_is_named_by_its_place(tmp_path):
    parts = [{"type": "text", "text": "What is in"}, {"type": "text", "text": "this plot?"}, {"type": "image_url"}]
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": parts}, PAIR[1]]}])
    assert refusal(path) == (f'{path}: line 1: turn content parts must all be {{"type": "text", "text": ...}}, and '
                             "part 3 is not (a drafter of text reads no images or audio; an answer's thinking "
                             "parts go ahead of its text)")


@pytest.mark.parametrize("role, kind", [(True, "bool"), (1, "int"), (["user"], "list"), ({"name": "user"}, "dict")])
def test_a_role_that_is_no_text_is_named_by_its_kind(tmp_path, role, kind):
    """Named by its repr, true was "unknown role True" and ["user"] "unknown role ['user']"."""
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": role, "content": "hi"}, PAIR[1]]}])
    assert refusal(path) == f"{path}: line 1: a turn's role is {kind}, not text"
    sharegpt = write_jsonl(tmp_path / "s.jsonl", [{"conversations": [{"from": role, "value": "hi"}]}])
    assert refusal(sharegpt) == f"{sharegpt}: line 1: a turn's role is {kind}, not text"


@pytest.mark.parametrize("turn", [{"content": "hi"}, {"role": "user", "content": None}, {"from": "human"},
                                  {"role": None, "content": "hi"}])
def test_a_turn_without_its_role_or_content_is_one_line(tmp_path, turn):
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": PAIR}, {"messages": [turn, PAIR[1]]}])
    assert refusal(path) == f"{path}: line 2: a turn lacks role/content (or from/value)"


def test_number_ids_are_named_as_python_writes_them(tmp_path):
    """Documented: a float id is accepted, named by its Python text, so `1.0` is another id than `1` and
    `1e2` is "100.0"; a string of that text is the same id, refused as text and number alike are."""
    rows = [f'{{"id": {given}, "messages": {json.dumps(PAIR)}}}' for given in ("1", "1.0", "1e2", "2.5")]
    convs, skipped = read_conversations(write_jsonl(tmp_path / "c.jsonl", rows))
    assert [c.id for c in convs] == ["1", "1.0", "100.0", "2.5"] and skipped == {}
    path = write_jsonl(tmp_path / "c.jsonl", [*rows, {"id": "100.0", "messages": PAIR}])
    assert refusal(path) == (f'{path}: line 5: id "100.0" and line 3\'s id 100.0 are the same as text; give the two '
                             "conversations distinct ids")


@pytest.mark.parametrize("blob", [codecs.BOM_UTF8, codecs.BOM_UTF8 + b"\r\n \n", codecs.BOM_UTF16_LE,
                                  "\n".encode("utf-16")])
def test_a_file_of_a_byte_order_mark_alone_holds_no_conversations(tmp_path, blob):
    path = tmp_path / "c.jsonl"
    path.write_bytes(blob)
    assert refusal(path) == f"{path}: holds no conversations"
