"""Null tool-call arguments and calls or tools stored as the JSON text null, as the reader takes them;
and the turn checks mutation testing found untested (review s72 h8)."""
import gzip
import json

import pytest

from drafter_lab.data.conversations import content_id, conversations_sha256, parse_call, read_conversations
from drafter_lab.errors import LabError

ASK = {"role": "user", "content": "time?"}
NOON = {"role": "assistant", "content": "noon"}


def _file(tmp_path, *rows) -> str:
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _read_one(tmp_path, row):
    (conv,), _ = read_conversations(_file(tmp_path, row))
    return conv


@pytest.mark.parametrize("arguments", [None, "null", " null ", "", {}])
def test_a_call_without_arguments_null_as_sglang_allows_has_none(tmp_path, arguments):
    """SGLang's FunctionResponse takes `arguments: null` (and a table of calls writes it where a call has
    none): refused, while a call that left arguments out, or gave "", was read as one without any."""
    call = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": arguments}}
    conv = _read_one(tmp_path, {"messages": [ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]})
    assert conv.messages[1]["tool_calls"] == [{"id": "c1", "type": "function",
                                               "function": {"name": "now", "arguments": {}}}]


def test_a_servers_call_with_null_arguments_is_one_without_any():
    """regenerate_server reads a server's calls through parse_call too."""
    assert parse_call({"function": {"name": "now", "arguments": None}}, "server answer", "http://x") == {
        "type": "function", "function": {"name": "now", "arguments": {}}}


@pytest.mark.parametrize("arguments", ["[1]", "1", "now", 7, [1]])
def test_arguments_that_are_no_object_are_still_refused(tmp_path, arguments):
    call = {"function": {"name": "now", "arguments": arguments}}
    path = _file(tmp_path, {"messages": [ASK, {"role": "assistant", "content": "", "tool_calls": [call]}]})
    with pytest.raises(LabError, match=r"line 1: a tool call needs a name and arguments \(an object, or a JSON "):
        read_conversations(path)


@pytest.mark.parametrize("calls", ["null", " null\n"])
def test_tool_calls_stored_as_the_json_text_null_are_none(tmp_path, calls):
    """A column of JSON text (json.dumps of each row's calls) holds "null" on rows without any: it was
    refused ("must be a list") while "[]" and "" were read as no calls."""
    conv = _read_one(tmp_path, {"messages": [ASK, {**NOON, "tool_calls": calls}]})
    assert conv.messages[1] == NOON and conv.id == content_id([ASK, NOON])


@pytest.mark.parametrize("row", [{"tools": "null"}, {"functions": "null"}, {"tools": "null", "functions": "null"}])
def test_tools_stored_as_the_json_text_null_are_none(tmp_path, row):
    conv = _read_one(tmp_path, {**row, "messages": [ASK, NOON]})
    assert conv.tools is None and conv.id == content_id([ASK, NOON])


def test_a_refused_content_part_is_named_by_its_place_from_1(tmp_path):
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x.png"}}]
    path = _file(tmp_path, {"messages": [{"role": "user", "content": parts}, NOON]})
    with pytest.raises(LabError, match=r"line 1: turn content parts must all be .*, and part 2 is not \(a drafter"):
        read_conversations(path)


@pytest.mark.parametrize("temperature", [0, 0.7])
def test_a_regenerated_answer_keeps_how_it_was_sampled(tmp_path, temperature):
    """What a token-exact capture compares with its own target and render: dropped, another target's
    answers would be taken as this one's. Token 0 is a token (a vocabulary's first), 0 greedy sampling."""
    recorded = {"token_ids": [0, 6], "temperature": temperature, "target_fingerprint": "fp:abc",
                "rendered_with": {"chat_template_sha256": "ab"}, "finish_reason": "length"}
    conv = _read_one(tmp_path, {"messages": [ASK, {**NOON, **recorded}]})
    assert conv.messages[1] == {**NOON, **recorded}


def test_a_tool_result_of_typed_objects_is_told_to_go_as_json_text(tmp_path):
    hits = [{"type": "hit", "url": "a"}]
    path = _file(tmp_path, {"messages": [ASK, {"role": "tool", "content": hits}, NOON]})
    with pytest.raises(LabError, match=r"part 1 is not \(a drafter of text reads no images or audio; a result that "
                                       r"is a JSON array of typed objects goes as its JSON text\)$"):
        read_conversations(path)


@pytest.mark.parametrize("turn", ["hi", ["user", "hi"], None])
def test_a_turn_that_is_no_object_is_one_line(tmp_path, turn):
    path = _file(tmp_path, {"messages": [turn, NOON]})
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == f"{path}: line 1: a turn is {type(turn).__name__}, not an object"


def test_a_line_of_bytes_that_are_no_utf8_is_named_by_its_line(tmp_path):
    """UTF-8 is read line by line, so the error names the line that holds the bad bytes."""
    path = tmp_path / "c.jsonl"
    path.write_bytes(json.dumps({"messages": [ASK, NOON]}).encode() + b'\n{"id": "\xff"}\n')
    with pytest.raises(LabError, match=r"c\.jsonl: line 2 is not valid JSON \("):
        read_conversations(path)


def test_a_bom_file_too_names_the_line_of_bytes_that_are_no_utf8(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"messages": [ASK, NOON]}).encode() + b'\n{"id": "\xff"}\n')
    with pytest.raises(LabError, match=r"c\.jsonl: line 2 is not valid JSON \("):
        read_conversations(path)


def test_an_empty_thinking_beside_a_null_answer_is_an_empty_answer(tmp_path):
    """A server's answer cut off before it said anything: the thinking field is given, if empty."""
    conv = _read_one(tmp_path, {"messages": [ASK, {"role": "assistant", "content": None, "reasoning_content": ""}]})
    assert conv.messages[1] == {"role": "assistant", "content": ""}


def test_a_path_given_as_text_is_read(tmp_path):
    (conv,), _ = read_conversations(str(_file(tmp_path, {"id": "a", "messages": [ASK, NOON]})))
    assert conv.id == "a"


def test_a_path_through_a_file_says_the_systems_reason_alone(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(LabError) as e:
        read_conversations(tmp_path / "f" / "c.jsonl")
    assert str(e.value) == f"{tmp_path / 'f' / 'c.jsonl'}: cannot read the conversations file (Not a directory)"


@pytest.mark.parametrize("role", [True, 1, ["user"]])
def test_a_role_that_is_no_text_is_one_line(tmp_path, role):
    path = _file(tmp_path, {"messages": [{"role": role, "content": "hi"}, NOON]})
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == f"{path}: line 1: a turn's role is {type(role).__name__}, not text"


@pytest.mark.parametrize("text", ["", "\n\n", "[]", " [ ] "])
def test_a_file_without_rows_holds_no_conversations(tmp_path, text):
    path = tmp_path / "c.jsonl"
    path.write_text(text)
    with pytest.raises(LabError) as e:
        read_conversations(path, prompts=True)
    assert str(e.value) == f"{path}: holds no conversations"


def test_a_non_finite_number_names_its_turn_from_1(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", '
                    '"token_ids": [1], "rendered_with": {"seed": NaN}}]}\n')
    with pytest.raises(LabError, match=r"line 1: turn 2 has NaN, which is not a JSON number$"):
        read_conversations(path)


@pytest.mark.parametrize("cid", [True, ["a"], {"a": 1}])
def test_an_id_that_is_no_text_or_number_is_one_line(tmp_path, cid):
    path = _file(tmp_path, {"id": cid, "messages": [ASK, NOON]})
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == f"{path}: line 1: id is {type(cid).__name__}, not text or a number"


def test_the_hash_of_a_missing_file_names_it_as_its_read_does(tmp_path):
    """A file moved while a target loaded: one line, not an error of the hash's own."""
    with pytest.raises(LabError) as e:
        conversations_sha256(tmp_path / "gone.jsonl")
    assert str(e.value) == f"{tmp_path / 'gone.jsonl'}: conversations file not found"


def test_the_hash_of_a_cut_gzip_file_is_refused_not_taken_of_what_it_read(tmp_path):
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(gzip.compress(json.dumps({"messages": [ASK, NOON]}).encode() * 50)[:-12])
    with pytest.raises(LabError, match=r"c\.jsonl\.gz: gzip-compressed, but cannot be decompressed \("):
        conversations_sha256(path)
