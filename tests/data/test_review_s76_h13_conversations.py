"""Reading conversations files: sampling fields at their edges, paths that cannot be read, files with no
rows, the hash of a gzip file, and a written file read back."""

from __future__ import annotations

import gzip
import hashlib
import json

import pytest

from drafter_lab.data.conversations import (
    Conversation,
    conversations_sha256,
    read_conversations,
    write_conversations,
)
from drafter_lab.errors import LabError


def answered(**fields) -> dict:
    return {"id": "a", "conversations": [{"role": "user", "content": "q"},
                                         {"role": "assistant", "content": "x", **fields}]}


def read_one(tmp_path, record: dict) -> list[dict]:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(record) + "\n")
    convs, _ = read_conversations(path)
    return convs[0].messages


def test_greedy_temperature_zero_is_kept(tmp_path):
    # a greedy regeneration records temperature 0: the lower bound is in, not out
    turn = read_one(tmp_path, answered(token_ids=[1, 2], temperature=0))[1]
    assert turn["temperature"] == 0 and turn["token_ids"] == [1, 2]


def test_a_finish_reason_is_read_on_an_assistant_turn_only(tmp_path):
    record = answered(finish_reason={"type": "length", "matched": None})  # SGLang's native form
    record["conversations"][0]["finish_reason"] = "stop"  # no server ends a user turn: left out
    user, assistant = read_one(tmp_path, record)
    assert "finish_reason" not in user and assistant["finish_reason"] == "length"


@pytest.mark.parametrize("reason", [5, ["length"], {"type": None}])
def test_a_finish_reason_that_is_not_text_is_refused(tmp_path, reason):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(answered(finish_reason=reason)) + "\n")
    with pytest.raises(LabError) as e:
        read_conversations(path)
    field = "finish_reason's type" if isinstance(reason, dict) else "finish_reason"  # SGLang's form names its part
    assert str(e.value) == f'{path}: line 1: {field} must be text ("stop", "length")'


@pytest.mark.parametrize("make, said", [
    (lambda p: p / "missing.jsonl", "conversations file not found"),
    (lambda p: p, "conversations path is a directory, not a jsonl file"),
])
def test_a_path_that_cannot_be_read_is_named_as_what_it_is(tmp_path, make, said):
    path = make(tmp_path)
    for read in (read_conversations, conversations_sha256):
        with pytest.raises(LabError) as e:
            read(path)
        assert str(e.value) == f"{path}: {said}"


@pytest.mark.parametrize("text", ["", "\n\n", "[]"])
def test_a_file_without_rows_holds_no_conversations(tmp_path, text):
    path = tmp_path / "c.jsonl"
    path.write_text(text)
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert str(e.value) == f"{path}: holds no conversations"


def test_a_gzip_file_hashes_as_its_plain_copy(tmp_path):
    plain = json.dumps(answered()).encode() + b"\n"
    packed = tmp_path / "c.jsonl.gz"
    packed.write_bytes(gzip.compress(plain, compresslevel=1))
    (tmp_path / "c.jsonl").write_bytes(plain)
    assert conversations_sha256(packed) == conversations_sha256(tmp_path / "c.jsonl") == hashlib.sha256(plain).hexdigest()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(packed.read_bytes()[:-6])  # the trailer gone: the stream ends early
    for read in (read_conversations, conversations_sha256):
        with pytest.raises(LabError, match="gzip-compressed, but cannot be decompressed"):
            read(cut)


def test_written_conversations_read_back_as_they_were(tmp_path):
    convs = [Conversation(id="1", messages=[{"role": "user", "content": "é"}, {"role": "assistant", "content": "b"}]),
             Conversation(id="2", messages=[{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}],
                          tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])]
    path = tmp_path / "out.jsonl"
    write_conversations(path, convs)
    assert path.read_bytes().decode("utf-8").splitlines() == [json.dumps(c.record(), ensure_ascii=False) for c in convs]
    assert read_conversations(path) == (convs, {})
