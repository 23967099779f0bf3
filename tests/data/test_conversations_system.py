"""A record's top-level `system` field (LLaMA-Factory's ShareGPT column) is its system prompt."""

from __future__ import annotations

import pytest
from data_helpers import write_jsonl

from drafter_lab.data.conversations import read_conversations, write_conversations
from drafter_lab.errors import LabError

HI = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
AB = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]


def test_system_field_becomes_the_first_turn(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [
        {"conversations": HI, "system": "You are terse."},
        {"messages": AB, "system": "Answer in French."},  # OpenAI-style exports may carry it too
        {"conversations": HI},
    ])
    convs, skipped = read_conversations(path)
    assert skipped == {}
    assert convs[0].messages == [{"role": "system", "content": "You are terse."},
                                 {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert convs[1].messages[0] == {"role": "system", "content": "Answer in French."}
    assert [m["role"] for m in convs[1].messages] == ["system", "user", "assistant"]
    # The same turns under another system prompt are another conversation, not a duplicate.
    assert convs[0].id != convs[2].id

    out = tmp_path / "out.jsonl"
    write_conversations(out, convs)
    back, _ = read_conversations(out)
    assert [(c.id, c.messages) for c in back] == [(c.id, c.messages) for c in convs]


def test_records_without_system_keep_their_turns_and_ids(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [
        {"conversations": HI},
        {"messages": [{"role": "system", "content": "Be brief."}, *AB]},
        {"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}], "system": ""},
        {"conversations": [{"from": "human", "value": "p"}, {"from": "gpt", "value": "q"}], "system": None},
        # the same prompt as the leading system turn and as the field: not doubled
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "c"},
                      {"role": "assistant", "content": "d"}], "system": "Be brief."},
    ])
    convs, _ = read_conversations(path)
    # The ids the lab gave these records before it read `system`: splits and caches of old data hold.
    assert [c.id for c in convs] == ["sha256:9f5c11837b4d7d03", "sha256:9c8fe28394b96942", "sha256:b6612839e7fa29e5",
                                     "sha256:12524f4cd7ee668a", "sha256:b1f53a5d184328a5"]
    assert [[m["role"] for m in c.messages] for c in convs] == [
        ["user", "assistant"], ["system", "user", "assistant"], ["user", "assistant"], ["user", "assistant"],
        ["system", "user", "assistant"]]


@pytest.mark.parametrize("first", ["system", "developer"])
def test_system_field_against_another_leading_system_turn_is_refused(tmp_path, first):
    path = write_jsonl(tmp_path / "c.jsonl", [
        {"conversations": HI},
        {"messages": [{"role": first, "content": "Be brief."}, *AB], "system": "Be verbose."},
    ])
    for strict in (False, True):
        with pytest.raises(LabError, match=rf"line 2: a top-level system prompt and a different leading {first} turn") as e:
            read_conversations(path, strict=strict)
        assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("system", "kind"), [(42, "int"), (["You are terse."], "list"), ({"text": "x"}, "dict")])
def test_system_field_not_text_is_refused(tmp_path, system, kind):
    path = write_jsonl(tmp_path / "c.jsonl", [{"conversations": HI}, {"conversations": HI, "system": system}])
    with pytest.raises(LabError, match=rf"line 2: top-level system is {kind}, not text") as e:
        read_conversations(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
