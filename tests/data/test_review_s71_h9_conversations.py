"""An answer's recorded template variables, and empty tools and calls, as the reader takes them (review s71 h9)."""
import json

import pytest

from drafter_lab.data.conversations import content_id, read_conversations
from drafter_lab.errors import LabError

ASK = {"role": "user", "content": "time?"}


def _file(tmp_path, row) -> str:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


def _answer(rendered_with):
    return {"conversations": [ASK, {"role": "assistant", "content": "noon", "token_ids": [1, 2],
                                    "rendered_with": rendered_with}]}


@pytest.mark.parametrize("kwargs", ["enable_thinking=false", ["enable_thinking"], 0])
def test_recorded_template_variables_that_are_no_object_are_one_line(tmp_path, kwargs):
    """chat.pinned passes over such an answer; the reader let it through, to be compared unequal with
    every render (a note, or a token-exact refusal that blamed the template, not the file)."""
    path = _file(tmp_path, _answer({"chat_template_sha256": "ab", "chat_template_kwargs": kwargs}))
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == (f"{path}: line 1: rendered_with's chat_template_kwargs is {type(kwargs).__name__}, "
                            "not an object")


def test_a_recorded_day_that_is_no_day_is_one_line(tmp_path):
    path = _file(tmp_path, _answer({"chat_template_kwargs": {"template_date": "yesterday"}}))
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == (f"{path}: line 1: rendered_with's template_date must be a day written YYYY-MM-DD, "
                            "got 'yesterday'")


@pytest.mark.parametrize("kwargs", [None, {}, {"enable_thinking": False, "template_date": "2026-12-01"}])
def test_recorded_template_variables_of_an_object_or_null_are_kept(tmp_path, kwargs):
    recorded = {"chat_template_sha256": "ab", "chat_template_kwargs": kwargs}
    (conv,), _ = read_conversations(_file(tmp_path, _answer(recorded)))
    assert conv.messages[1]["rendered_with"] == recorded


@pytest.mark.parametrize("row", [{"tools": ""}, {"tools": "  "}, {"functions": ""}, {"tools": None}, {}])
def test_an_empty_tools_string_is_no_tools_as_an_empty_tool_calls_string_is(tmp_path, row):
    """A table's JSON-text column holds "" on rows without tools: it refused the file, while the same
    "" as tool_calls was read as no calls."""
    turns = [ASK, {"role": "assistant", "content": "noon", "tool_calls": ""}]
    (conv,), _ = read_conversations(_file(tmp_path, {**row, "messages": turns}))
    assert conv.tools is None and conv.id == content_id([ASK, {"role": "assistant", "content": "noon"}])


def test_an_empty_tools_string_beside_functions_gives_way_to_them(tmp_path):
    fn = {"name": "now", "parameters": {"type": "object", "properties": {}}}
    (conv,), _ = read_conversations(_file(tmp_path, {"tools": "", "functions": [fn], "messages": [
        ASK, {"role": "assistant", "content": "noon"}]}))
    assert conv.tools == [{"type": "function", "function": fn}]


@pytest.mark.parametrize("calls", ["[]", " [] ", [], "", " \n"])
def test_tool_calls_stored_as_the_json_text_of_none_are_none(tmp_path, calls):
    """tools "[]" was read (as []) while tool_calls "[]" refused the file: "must be a list"."""
    (conv,), _ = read_conversations(_file(tmp_path, {"messages": [
        ASK, {"role": "assistant", "content": "noon", "tool_calls": calls}]}))
    assert conv.messages[1] == {"role": "assistant", "content": "noon"}


def test_tool_calls_of_text_that_is_no_json_list_are_still_refused(tmp_path):
    path = _file(tmp_path, {"messages": [ASK, {"role": "assistant", "content": "noon", "tool_calls": "now()"}]})
    with pytest.raises(LabError, match=r"line 1: tool_calls must be a list, on an assistant turn$"):
        read_conversations(path)
