"""Review of session 68 (h9): a row nested as deep as json reads it is checked for NaN without a
RecursionError; a turn that is no object is one line naming it (mutation audit of conversations.py,
the turn parser and the file reader's tail): so is a cut-short gzip file a hash is asked of; text is
written as the UTF-8 it is."""

from __future__ import annotations

import gzip
import sys

import pytest
from data_helpers import make_conversations, write_jsonl

from drafter_lab.data.conversations import conversations_sha256, read_conversations, write_conversations
from drafter_lab.errors import LabError

PAIR = [{"role": "user", "content": "How big is setup.py?"}, {"role": "assistant", "content": "2 KB."}]

# Deeper than a recursive walk of the row could go (two frames a level), shallower than json's own limit.
DEPTH = sys.getrecursionlimit() * 6 // 10


def nested(inner):
    for _ in range(DEPTH):
        inner = [inner]
    return inner


def deep_rows(inner) -> list[dict]:
    """One row with `inner` nested DEPTH lists deep in each place the reader checks for NaN."""
    answer = {**PAIR[1], "token_ids": [1], "rendered_with": {"a": nested(inner)}}
    call = {**PAIR[1], "tool_calls": [{"name": "stat", "arguments": {"a": nested(inner)}}]}
    return [{"id": nested(inner), "conversations": PAIR}, {"tools": [{"a": nested(inner)}], "conversations": PAIR},
            {"conversations": [PAIR[0], answer]}, {"conversations": [PAIR[0], call]}]


@pytest.mark.parametrize("k", range(1, 4))  # 0, an id so nested, is refused as a list (test_review_s69_h1)
def test_a_row_nested_as_deep_as_json_reads_it_is_read(tmp_path, k):
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [deep_rows(0)[k]]))
    assert conv.messages[-1]["content"] == "2 KB."


@pytest.mark.parametrize("k, what", [(0, "id has NaN"), (1, "tools has NaN"), (2, "turn 2 has NaN"),
                                     (3, "a tool call's arguments hold NaN")])
def test_a_nan_nested_as_deep_as_json_reads_it_is_named(tmp_path, k, what):
    path = write_jsonl(tmp_path / "c.jsonl", [deep_rows(float("nan"))[k]])
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value).startswith(f"{path}: line 1: {what}")


@pytest.mark.parametrize("turn, kind", [("How big?", "str"), (["user", "How big?"], "list"), (None, "NoneType")])
def test_a_turn_that_is_no_object_is_one_line(tmp_path, turn, kind):
    path = write_jsonl(tmp_path / "c.jsonl", [{"conversations": PAIR}, {"conversations": [turn, PAIR[1]]}])
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == f"{path}: line 2: a turn is {kind}, not an object"


def test_the_hash_of_a_cut_short_gzip_file_is_refused_as_its_read_is(tmp_path):
    """Hashed as far as it could be read, a cut-short file would key a capture or a regeneration journal
    as if it held those conversations alone."""
    plain = write_jsonl(tmp_path / "c.jsonl", make_conversations(3))
    packed = tmp_path / "c.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes())[:-12])
    with pytest.raises(LabError) as e:
        conversations_sha256(packed)
    assert str(e.value).startswith(f"{packed}: gzip-compressed, but cannot be decompressed (")
    assert "\n" not in str(e.value)


def test_written_text_is_utf8_not_escapes(tmp_path):
    """Written as text, as SpecForge's own jsonl is, so a person reads a non-English dataset as it is."""
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "größe", "conversations": [
        {"role": "user", "content": "setup.py の大きさは?"}, {"role": "assistant", "content": "2 KB — klein."}]}])
    convs, _ = read_conversations(path)
    write_conversations(out := tmp_path / "out.jsonl", convs)
    text = out.read_text(encoding="utf-8")
    assert "größe" in text and "setup.py の大きさは?" in text and "2 KB — klein." in text
    assert read_conversations(out)[0] == convs
