"""Reading SpecForge/ShareGPT jsonl: both dialects, stable ids, skips, and one-line errors."""

from __future__ import annotations

import json

import pytest
from data_helpers import make_conversations, write_jsonl

from drafter_lab.data.conversations import read_conversations, write_conversations
from drafter_lab.errors import LabError


def test_reads_both_dialects_with_stable_ids(tmp_path):
    rows = make_conversations(4)
    rows.append({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    rows.append({"messages": [{"role": "developer", "content": "d"}, {"role": "user", "content": "a"},
                              {"role": "assistant", "content": "b"}]})
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    convs, skipped = read_conversations(path)
    assert skipped == {}
    assert len(convs) == 6
    # OpenAI's `developer` turn reaches the chat template as it is, as a server hands it over.
    assert [m["role"] for m in convs[5].messages] == ["developer", "user", "assistant"]
    # ShareGPT `human`/`gpt` turns come out as user/assistant, with the system turn kept.
    assert [m["role"] for m in convs[0].messages] == ["system", "user", "assistant", "user", "assistant"]
    assert convs[0].messages[2]["content"] == rows[0]["conversations"][2]["value"]
    assert convs[1].id == "chat-1" and convs[1].messages[0]["role"] == "user"
    assert convs[0].id.startswith("sha256:")  # no id in the file: a hash of the turns
    again, _ = read_conversations(path)
    assert [c.id for c in again] == [c.id for c in convs]

    out = tmp_path / "out.jsonl"
    write_conversations(out, convs)
    back, _ = read_conversations(out)
    assert [(c.id, c.messages) for c in back] == [(c.id, c.messages) for c in convs]


def test_conversation_without_assistant_is_skipped_or_refused(tmp_path):
    rows = make_conversations(3)
    rows.insert(1, {"conversations": [{"from": "human", "value": "anyone?"}]})
    rows.append(rows[2])  # the same chat twice: kept once
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    convs, skipped = read_conversations(path)
    assert len(convs) == 3
    assert skipped == {"no_assistant_turn": 1, "duplicate_id": 1}
    with pytest.raises(LabError, match=r"line 2: conversation has no assistant turn") as e:
        read_conversations(path, strict=True)
    assert str(path) in str(e.value)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"conversations": [{"role": "user", "content": "x"}', "line 3 is not valid JSON"),
        ("[" * 200_000, "line 3 is not valid JSON (maximum recursion depth exceeded"),  # RecursionError
        ('{"id": ' + "9" * 5000 + "}", "line 3 is not valid JSON (Exceeds the limit (4300 digits)"),  # ValueError
        ('["not", "an", "object"]', "line 3: expected a JSON object"),
        ('{"conversations": [{"role": "robot", "content": "x"}]}', "line 3: unknown role 'robot'"),
        ('{"conversations": [{"role": "user"}]}', "line 3: a turn lacks role/content"),
        ('{"text": "no turns"}', "line 3: no `conversations`"),
        ('{"conversations": [{"role": "assistant", "content": "x", "token_ids": [1, -2]}]}',
         "line 3: token_ids must be a list of token ids"),
        ('{"conversations": [{"role": "assistant", "content": "x", "token_ids": "1 2"}]}',
         "line 3: token_ids must be a list of token ids"),
        ('{"conversations": [{"role": "assistant", "content": "x", "token_ids": [1], "temperature": "hot"}]}',
         "line 3: temperature must be a finite number >= 0"),
        ('{"conversations": [{"role": "assistant", "content": "x", "token_ids": [1], "temperature": -1}]}',
         "line 3: temperature must be a finite number >= 0"),
        ('{"conversations": [{"role": "assistant", "content": "x", "token_ids": [1], "temperature": Infinity}]}',
         "line 3: temperature must be a finite number >= 0"),
        ('{"conversations": [{"role": "assistant", "content": "x", "token_ids": [1], "target_fingerprint": 7}]}',
         "line 3: target_fingerprint must be text"),
        ('{"conversations": [{"role": "assistant", "content": "x", "token_ids": [1], "rendered_with": "t"}]}',
         "line 3: rendered_with must be an object"),
        ('{"conversations": [{"role": "assistant", "content": "x", "reasoning_content": ["a"]}]}',
         "line 3: reasoning_content (or reasoning, thinking) must be text, on an assistant turn"),
        ('{"conversations": [{"role": "user", "content": "x", "reasoning": "hm"}]}',
         "line 3: reasoning_content (or reasoning, thinking) must be text, on an assistant turn"),
        ('{"conversations": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a.png"}}]}]}',
         'line 3: turn content parts must all be {"type": "text", "text": ...}'),
        ('{"conversations": [{"role": "user", "content": [{"type": "text"}]}]}',
         'line 3: turn content parts must all be {"type": "text", "text": ...}'),
        ('{"conversations": [{"role": "user", "content": 7}]}', "line 3: turn content is int, not text"),
        ('{"conversations": [{"role": "user", "content": "hi \\ud83d there"}]}',  # json takes it, tokenizers do not
         "line 3: text holds an unpaired surrogate (\\ud83d)"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, bad, message):
    good = json.dumps(make_conversations(1)[0])
    path = write_jsonl(tmp_path / "c.jsonl", [good, "", bad, good])
    with pytest.raises(LabError) as e:
        read_conversations(path)
    assert message in str(e.value) and str(path) in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(LabError, match="conversations file not found"):
        read_conversations(tmp_path / "nope.jsonl")


def test_text_content_parts_join_with_newlines(tmp_path):
    parts = [{"type": "text", "text": "Read this:"}, {"type": "text", "text": "import os"}]
    row = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": [{"type": "text", "text": "OK."}]}]}
    (conv,), _ = read_conversations(write_jsonl(tmp_path / "c.jsonl", [row]))
    assert conv.messages == [{"role": "user", "content": "Read this:\nimport os"}, {"role": "assistant", "content": "OK."}]
